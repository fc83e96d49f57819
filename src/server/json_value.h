// JSON documents (a request's messages, tools, chat_template_kwargs) as the
// values a chat template reads: objects become dicts with their keys in
// document order, as Python's json module gives them to transformers.
// Header-only: `tern template` uses it in builds without the server.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "text/jinja_value.h"

namespace tern::server {

constexpr int kJsonValueMaxDepth = 256;

namespace detail {
inline bool json_to_value(const nlohmann::ordered_json& j, int depth, text::jinja::Value& out) {
    namespace jinja = text::jinja;
    using nlohmann::ordered_json;
    switch (j.type()) {
        case ordered_json::value_t::boolean: out = jinja::Value(j.get<bool>()); return true;
        case ordered_json::value_t::number_integer: out = jinja::Value(j.get<int64_t>()); return true;
        case ordered_json::value_t::number_unsigned: {
            // Python's ints are unbounded; past int64 the nearest double is
            // the closest value a template can hold.
            const uint64_t u = j.get<uint64_t>();
            out = u > uint64_t(std::numeric_limits<int64_t>::max()) ? jinja::Value(double(u)) : jinja::Value(int64_t(u));
            return true;
        }
        case ordered_json::value_t::number_float: out = jinja::Value(j.get<double>()); return true;
        case ordered_json::value_t::string: out = jinja::Value(j.get<std::string>()); return true;
        case ordered_json::value_t::array: {
            if (depth >= kJsonValueMaxDepth) return false;
            jinja::List l(j.size());
            for (size_t i = 0; i < j.size(); ++i)
                if (!json_to_value(j[i], depth + 1, l[i])) return false;
            out = jinja::Value(std::move(l));
            return true;
        }
        case ordered_json::value_t::object: {
            if (depth >= kJsonValueMaxDepth) return false;
            jinja::Dict d;
            for (const auto& [k, v] : j.items()) {
                jinja::Value x;
                if (!json_to_value(v, depth + 1, x)) return false;
                d.set(k, std::move(x));
            }
            out = jinja::Value(std::move(d));
            return true;
        }
        default: out = jinja::Value::none(); return true;  // null
    }
}
}  // namespace detail

// Empty when the document nests arrays and objects deeper than
// kJsonValueMaxDepth (the template engine's own nesting limit).
inline std::optional<text::jinja::Value> json_to_value(const nlohmann::ordered_json& j) {
    text::jinja::Value v;
    if (!detail::json_to_value(j, 0, v)) return std::nullopt;
    return v;
}

}  // namespace tern::server
