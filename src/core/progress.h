// A progress line for long work: bar, count, rate and ETA, plus free text (loss, tokens/s). On a terminal
// it redraws in place; otherwise it prints a plain line every `every` updates.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace anvil {

class Progress {
public:
    // `unit` names what is counted in the rate ("steps" -> "12.5 steps/s"); "B" counts bytes, shown as
    // "12.3/45.6 MB" and "MB/s".
    Progress(std::string label, int64_t total, int64_t every = 1, std::string unit = "it",
             std::FILE* out = stderr);
    void update(int64_t done, const std::string& text);
    void finish(const std::string& text);
    // Lines of other output between updates (the bar, on a terminal, is cleared first and redrawn by the next
    // update).
    void note(const std::string& text);

private:
    void draw(int64_t done, const std::string& text, bool final);
    std::string label_;
    int64_t total_, every_;
    std::string unit_;
    std::FILE* out_;
    bool tty_;
    std::chrono::steady_clock::time_point start_;
    int64_t last_done_ = -1;
    std::chrono::steady_clock::time_point last_time_;
    double rate_ = 0.0;  // items/s, exponentially smoothed over recent updates (ETA follows the current pace)
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

}  // namespace anvil
