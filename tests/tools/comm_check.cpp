// anvil_comm_check MODE: the job's collectives (dist/comm.h) run by tests/dist/test_comm.py under mpirun.
//   basic          all-reduce (float, overlapped; double), all-gather, broadcast, barrier, reduce-scatter and
//                  all-gather of blocks, a split into groups, and the start-up agreement check, each result
//                  compared with what it must be; one line per rank
//   stall SECONDS  rank 1 stops itself (SIGSTOP) before an all-reduce: the others must give up after SECONDS
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"

int main(int argc, char** argv) try {
    using namespace anvil;
    const std::string mode = argc > 1 ? argv[1] : "basic";
    const double timeout = mode == "stall" && argc > 2 ? std::atof(argv[2]) : 60.0;
    std::unique_ptr<Comm> c = make_comm(timeout);
    const int r = c->rank(), w = c->size();
    if (mode == "stall") {
        if (r == 1) raise(SIGSTOP);
        sleep(1);
        float x = 1.0f;
        c->allreduce_sum(&x, 1, "the all-reduce a stopped rank never joins");
        std::printf("rank %d: the all-reduce completed although rank 1 is stopped\n", r);
        return 1;
    }
    int bad = 0;
    auto expect = [&](bool ok, const char* what) {
        if (!ok) std::printf("rank %d: FAIL %s\n", r, what), bad++;
    };
    // two overlapping float sums of different sizes, waited in reverse order
    std::vector<float> a(1000), b(37);
    for (size_t i = 0; i < a.size(); i++) a[i] = float(r + 1) * float(i);
    for (size_t i = 0; i < b.size(); i++) b[i] = float(r) - float(i);
    const Comm::Pending pa = c->allreduce_sum_start(a.data(), a.size(), "all-reduce a");
    const Comm::Pending pb = c->allreduce_sum_start(b.data(), b.size(), "all-reduce b");
    c->wait(pb);
    c->wait(pa);
    const float tri = float(w * (w + 1) / 2), ranks = float(w * (w - 1) / 2);
    bool ok = true;
    for (size_t i = 0; i < a.size(); i++) ok &= a[i] == tri * float(i);
    for (size_t i = 0; i < b.size(); i++) ok &= b[i] == ranks - float(w) * float(i);
    expect(ok, "float all-reduce");
    double d[2] = {0.5 * r, 1e300 / w};
    c->allreduce_sum(d, 2, "double all-reduce");
    expect(d[0] == 0.5 * ranks && std::fabs(d[1] - 1e300) < 1e288, "double all-reduce");
    std::vector<int> all(size_t(w), -1);
    const int mine = 100 + r;
    c->allgather(&mine, sizeof mine, all.data(), "all-gather");
    for (int k = 0; k < w; k++) expect(all[size_t(k)] == 100 + k, "all-gather");
    char msg[16] = {};
    if (r == 0) std::snprintf(msg, sizeof msg, "from rank 0");
    c->broadcast(msg, sizeof msg, 0, "broadcast");
    expect(std::string(msg) == "from rank 0", "broadcast");
    c->barrier("barrier");
    // blocks of 3, 5, 7, ... floats: rank k's block is summed on rank k, then every block gathered
    std::vector<size_t> counts;
    size_t n = 0;
    for (int k = 0; k < w; k++) counts.push_back(size_t(3 + 2 * k)), n += counts.back();
    std::vector<float> blocks(n);
    for (size_t i = 0; i < n; i++) blocks[i] = float(i) + float(r);
    std::vector<Comm::Pending> sums;  // each block summed on its own rank, all started before any wait
    for (int k = 0, at = 0; k < w; at += int(counts[size_t(k)]), k++)
        sums.push_back(c->reduce_sum_start(blocks.data() + at, counts[size_t(k)], k, "reduce to a root"));
    for (const Comm::Pending& p : sums) c->wait(p);
    size_t at = 0;
    for (int k = 0; k < r; k++) at += counts[size_t(k)];
    ok = true;
    for (size_t i = 0; i < n; i++) {  // the own block summed; the others as this rank had them
        const bool own = i >= at && i < at + counts[size_t(r)];
        ok &= blocks[i] == (own ? float(w) * float(i) + ranks : float(i) + float(r));
    }
    expect(ok, "reduce to a root");
    for (size_t i = 0; i < n; i++)
        if (i < at || i >= at + counts[size_t(r)]) blocks[i] = -1.0f;  // all-gather must overwrite them
    c->allgather_blocks(blocks.data(), counts, "all-gather of blocks");
    ok = true;
    for (size_t i = 0; i < n; i++) ok &= blocks[i] == float(w) * float(i) + ranks;
    expect(ok, "all-gather of blocks");
    // groups of the even and the odd ranks, ordered backwards
    std::unique_ptr<Comm> g = c->split(r % 2, -r);
    double one = 1.0;
    g->allreduce_sum(&one, 1, "the group's size");
    const int size = (w - r % 2 + 1) / 2;  // the ranks of r's parity; r's place counting down from the top
    expect(int(one) == size && g->size() == size && g->rank() == (w - 1 - r) / 2, "split");
    check_same(*c, 42, "the options");  // equal everywhere: no error
    std::string differs;
    try {
        check_same(*c, r == w - 1 && w > 1 ? 7 : 42, "the options");
    } catch (const Error& e) {
        differs = e.what();
    }
    expect(w == 1 ? differs.empty()
                  : differs.find("rank " + std::to_string(w - 1) + " differs from rank 0 in the options") !=
                        std::string::npos,
           "check_same names the rank that differs");
    std::printf("rank %d of %d (local rank %d, %s): %s\n", r, w, c->local_rank(), c->kind(),
                bad ? "FAILED" : "ok");
    return bad ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "anvil_comm_check: error: %s\n", e.what());
    return 1;
}
