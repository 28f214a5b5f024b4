#include "core/progress.h"

#include <unistd.h>

#include <cmath>

#include <fmt/format.h>

namespace anvil {

std::string format_duration(double s) {
    if (!std::isfinite(s) || s < 0) return "?";
    const long t = long(s + 0.5);
    if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
    if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
    return fmt::format("{}s", t);
}

Progress::Progress(std::string label, int64_t total, int64_t every, std::string unit, std::FILE* out)
    : label_(std::move(label)),
      total_(total),
      every_(every > 0 ? every : 1),
      unit_(std::move(unit)),
      out_(out),
      tty_(::isatty(::fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(int64_t done, const std::string& text) {
    const auto now = std::chrono::steady_clock::now();
    if (last_done_ >= 0 && done > last_done_) {
        const double dt = std::chrono::duration<double>(now - last_time_).count();
        const double r = dt > 0 ? double(done - last_done_) / dt : 0.0;
        rate_ = rate_ > 0 ? 0.9 * rate_ + 0.1 * r : r;
    }
    // off a terminal, a line each time the count passes a multiple of `every` (it may move by more than one)
    const bool crossed = last_done_ < 0 ? done % every_ == 0 : done / every_ != last_done_ / every_;
    last_done_ = done;
    last_time_ = now;
    if (tty_ || crossed || done == total_) draw(done, text, false);
}

void Progress::finish(const std::string& text) {
    if (tty_) std::fputs("\r\033[K", out_);
    std::fprintf(out_, "%s %s\n", label_.c_str(), text.c_str());
    std::fflush(out_);
}

void Progress::note(const std::string& text) {
    if (tty_) std::fputs("\r\033[K", out_);
    std::fprintf(out_, "%s\n", text.c_str());
    std::fflush(out_);
}

void Progress::draw(int64_t done, const std::string& text, bool) {
    const double rate = rate_;
    const double eta = rate > 0 ? double(total_ - done) / rate : NAN;
    const double frac = total_ > 0 ? double(done) / double(total_) : 1.0;
    std::string line;
    if (tty_) {
        constexpr int kWidth = 24;
        const int filled = int(frac * kWidth);
        line = "\r\033[K" + label_ + " [" + std::string(size_t(filled), '=') +
               (filled < kWidth ? ">" + std::string(size_t(kWidth - filled - 1), ' ') : "") + "] ";
    } else {
        line = label_ + " ";
    }
    if (unit_ == "B") {  // in the unit the total reads best in (a 46 kB file is not "0.0/0.0 MB")
        const auto [scale, name] = total_ >= 1'000'000'000 ? std::pair{1e9, "GB"}
                                   : total_ >= 1'000'000   ? std::pair{1e6, "MB"}
                                                           : std::pair{1e3, "kB"};
        line +=
            fmt::format("{:.1f}/{:.1f} {} {:3.0f}% | {} | {:.1f} MB/s | ETA {}", double(done) / scale,
                        double(total_) / scale, name, 100.0 * frac, text, rate / 1e6, format_duration(eta));
    } else
        line += fmt::format("{}/{} {:3.0f}% | {} | {:.2f} {}/s | ETA {}", done, total_, 100.0 * frac, text,
                            rate, unit_, format_duration(eta));
    if (!tty_) line += "\n";
    std::fputs(line.c_str(), out_);
    std::fflush(out_);
}

}  // namespace anvil
