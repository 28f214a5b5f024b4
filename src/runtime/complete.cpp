#include "runtime/complete.h"

#include <algorithm>
#include <chrono>

#include "data/text_stream.h"

namespace anvil {

TextCompletion complete_text(Generator& gen, const Tokenizer& tok, const SampleOptions& s,
                             const std::vector<int32_t>& prompt, const std::vector<std::string>& stop,
                             const OnPiece& on_piece, bool logprobs) {
    using Clock = std::chrono::steady_clock;
    TextStream text(tok, stop);
    TextCompletion c;
    c.finish_reason = "length";
    bool go = true;
    const auto t0 = Clock::now();
    Clock::time_point first;
    bool any = false;
    c.tokens = gen.generate(
        prompt, s,
        [&](int32_t id) {
            if (!any) first = Clock::now(), any = true;
            if (std::count(s.stop_tokens.begin(), s.stop_tokens.end(), id)) {
                c.finish_reason = "stop";
                return true;  // the generator ends after an end token itself
            }
            const std::string piece = text.push({id});
            if (on_piece) go = on_piece(piece);
            if (text.stopped()) c.finish_reason = "stop";
            return go && !text.stopped();
        },
        logprobs ? &c.logprobs : nullptr);
    const auto t1 = Clock::now();
    const std::string rest = text.finish();  // nothing after a stop string
    if (go && on_piece && !rest.empty()) on_piece(rest);
    c.text = text.text();
    const auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
    const int n = int(c.tokens.size());
    const double decode = n ? ms(t1 - first) : 0.0;
    c.ttft_ms = n ? ms(first - t0) : ms(t1 - t0);
    c.total_ms = ms(t1 - t0);
    c.tokens_per_s = n > 1 && decode > 0 ? (n - 1) * 1e3 / decode : 0.0;
    return c;
}

}  // namespace anvil
