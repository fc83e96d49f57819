// Chat templates as the model ships them: a Jinja2 interpreter that renders
// tokenizer.chat_template the way Hugging Face transformers does
// (ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
// loopcontrols extension, the generation tag, raise_exception and
// strftime_now, and its own tojson). The language is the part real chat
// templates use: expressions, filters, tests and methods with Python's
// semantics, if / for (loop variables, else, filters, break / continue) /
// set (and set blocks, namespace attributes) / macro / filter blocks. A
// construct outside it (include, extends, call blocks, an unknown filter)
// is an error naming it, never ignored.
//
// A template is untrusted input: parsing and rendering read only the text
// and the values given, never files or the environment, and rendering stops
// with an error past the limits on output, work, nesting and time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/result.h"
#include "text/jinja_value.h"

namespace tern::text::jinja {

struct RenderLimits {
    size_t max_output_bytes = size_t(16) << 20;
    int64_t max_steps = 20'000'000;  // expressions and statements evaluated
    int max_depth = 256;             // nested expressions, blocks and macro calls
    double max_seconds = 10.0;
    // Bytes of strings and lists the template may build in all (what it
    // concatenates, repeats, joins, pads), whether or not it keeps them.
    size_t max_built_bytes = size_t(256) << 20;
};

struct RenderOptions {
    RenderLimits limits;
    // What strftime_now() formats; unset: the local time when rendering.
    std::optional<std::tm> now;
};

namespace detail {
struct Stmt;
}

class Template {
public:
    // Parses source; an error names the line and what is wrong.
    static Result<Template> parse(std::string_view source);

    // Renders with vars as the template's variables (messages, tools,
    // add_generation_prompt, bos_token, ...). A template error (including
    // raise_exception's message) or a limit reached is an Error.
    Result<std::string> render(const Dict& vars, const RenderOptions& options = {}) const;

private:
    std::shared_ptr<const std::vector<std::unique_ptr<detail::Stmt>>> program_;
};

// Parses an ISO-8601 date-time ("2026-12-01", "2026-12-01T09:30:00",
// seconds and a trailing offset optional) for RenderOptions::now.
std::optional<std::tm> parse_iso_time(std::string_view text);

}  // namespace tern::text::jinja
