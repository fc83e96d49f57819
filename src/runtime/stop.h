// Stop strings over a text stream: text is released as soon as it cannot be
// the start of a stop string, so a stop string never reaches the output, even
// when it arrives split across tokens.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tern::runtime {

class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops);

    // Adds text; returns what may be shown now. After a stop string is seen,
    // stopped() is true and nothing more is released.
    std::string push(std::string_view text);
    // End of stream: releases the held-back tail (no stop string completed).
    std::string flush();
    bool stopped() const { return stopped_; }

private:
    std::vector<std::string> stops_;
    std::string held_;
    bool stopped_ = false;
};

}  // namespace tern::runtime
