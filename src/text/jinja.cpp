// The template interface: parse once, render many times. Errors from the
// engine (which throws inside, see jinja_internal.h) become Error values here.
#include "text/jinja.h"

#include <cstdio>
#include <new>
#include <stdexcept>

#include "text/jinja_internal.h"

namespace tern::text::jinja {
namespace {

std::string describe(const detail::TemplateError& e) {
    return e.line > 0 ? "template line " + std::to_string(e.line) + ": " + e.message : e.message;
}

}  // namespace

Result<Template> Template::parse(std::string_view source) {
    try {
        Template t;
        t.program_ = std::make_shared<const detail::Body>(detail::parse(detail::lex(source)));
        return t;
    } catch (const detail::TemplateError& e) {
        return Error{describe(e)};
    } catch (const std::bad_alloc&) {
        return Error{"the template is too large to parse"};
    } catch (const std::exception& e) {
        return Error{std::string("the template could not be parsed: ") + e.what()};
    }
}

Result<std::string> Template::render(const Dict& vars, const RenderOptions& options) const {
    if (!program_) return Error{"render() on a template that was never parsed"};
    try {
        detail::Renderer r(vars, options);
        return r.render(*program_);
    } catch (const detail::TemplateError& e) {
        return Error{describe(e)};
    } catch (const std::length_error& e) {
        return Error{e.what()};
    } catch (const std::bad_alloc&) {
        return Error{"the template ran out of memory"};
    } catch (const std::exception& e) {  // a library's own error (a number out of range, ...)
        return Error{std::string("the template failed: ") + e.what()};
    }
}

std::optional<std::tm> parse_iso_time(std::string_view text) {
    std::tm tm{};
    int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0, used = 0;
    const std::string t(text);
    if (std::sscanf(t.c_str(), "%4d-%2d-%2d%n", &y, &mo, &d, &used) != 3 || used != 10) return std::nullopt;
    size_t pos = 10;
    if (pos < t.size() && (t[pos] == 'T' || t[pos] == ' ')) {
        int n = 0;
        if (std::sscanf(t.c_str() + pos + 1, "%2d:%2d%n", &h, &mi, &n) != 2 || n != 5) return std::nullopt;
        pos += 1 + size_t(n);
        if (pos < t.size() && t[pos] == ':') {
            if (std::sscanf(t.c_str() + pos + 1, "%2d%n", &s, &n) != 1 || n != 2) return std::nullopt;
            pos += 3;
            if (pos < t.size() && t[pos] == '.') {
                ++pos;
                while (pos < t.size() && t[pos] >= '0' && t[pos] <= '9') ++pos;
            }
        }
        // A trailing Z or +hh:mm is allowed; the time is used as written.
        if (pos < t.size() && t[pos] == 'Z') ++pos;
        else if (pos < t.size() && (t[pos] == '+' || t[pos] == '-')) pos = t.size();
    }
    if (pos != t.size()) return std::nullopt;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60) return std::nullopt;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = s;
    tm.tm_isdst = 0;
    // Weekday and day of the year for %a, %A, %j: timegm normalizes a UTC copy.
    std::tm copy = tm;
    const time_t when = timegm(&copy);
    if (when == time_t(-1)) return std::nullopt;
    gmtime_r(&when, &copy);
    tm.tm_wday = copy.tm_wday;
    tm.tm_yday = copy.tm_yday;
    return tm;
}

}  // namespace tern::text::jinja
