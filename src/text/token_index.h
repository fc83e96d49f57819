// Text -> token id lookup shared by the tokenizer models: a hash map that can
// be queried with a string_view without building a std::string.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tern::text {

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class TokenIndex {
public:
    // Keeps the first id seen for a text (vocabularies may repeat a text).
    void add(const std::string& text, int32_t id) { map_.try_emplace(text, id); }
    int32_t find(std::string_view text) const {
        auto it = map_.find(text);
        return it == map_.end() ? -1 : it->second;
    }
    size_t size() const { return map_.size(); }

private:
    std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> map_;
};

}  // namespace tern::text
