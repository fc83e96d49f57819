// The server-sent event of one streamed piece of text, made once a request:
// the whole event as the server writes it around a placeholder string, cut
// where the placeholder stands. A piece then costs its own escaping and two
// appends, where building and dumping the event's JSON document took most of
// the scheduler's own time a token at 64 streams; the bytes are those the
// document would give (tests/server/test_piece_event.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tern::server {

// JSON as the server writes it: compact, invalid UTF-8 replaced by U+FFFD.
inline std::string dump_json(const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class PieceEvent {
public:
    // make(value): the event with `value`, a JSON string, where the piece goes;
    // the placeholder must be the first string of its kind in the event (a
    // chunk's first key, "choices", holds it).
    template <class Make>
    explicit PieceEvent(Make make) {
        const std::string event = make(nlohmann::json(kPlaceholder));
        const std::string quoted = dump_json(nlohmann::json(kPlaceholder));
        const size_t at = event.find(quoted);
        if (at == std::string::npos) throw std::logic_error("PieceEvent: the event does not hold its value");
        head_ = event.substr(0, at);
        tail_ = event.substr(at + quoted.size());
    }
    std::string operator()(std::string_view piece) const {
        const std::string value = dump_json(nlohmann::json(std::string(piece)));
        std::string out;
        out.reserve(head_.size() + value.size() + tail_.size());
        return out.append(head_).append(value).append(tail_);
    }

private:
    static constexpr const char* kPlaceholder = "\x01tern-piece\x01";
    std::string head_, tail_;
};

}  // namespace tern::server
