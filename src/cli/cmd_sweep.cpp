// anvil sweep: every combination of a grid of `anvil train` flags, each its own run directory (resumable: a
// finished run is skipped, an interrupted one resumed), then one table (sweep.csv, sweep.md) and the
// validation loss curves overlaid (sweep.png).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "core/error.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil::cli {

namespace {

struct Axis {
    std::string key, flag;  // "lora_rank", "--lora-rank"
    std::vector<std::string> values;
};

// "lr=1e-4,3e-4 lora_rank=4,8" -> axes, each flag checked against `anvil train`'s.
std::vector<Axis> parse_grid(const std::string& grid, const CLI::App& train) {
    std::vector<Axis> axes;
    std::istringstream ss(grid);
    std::string item;
    while (ss >> item) {
        const size_t eq = item.find('=');
        ANVIL_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < item.size(),
                    "--grid: \"{}\" is not KEY=V1,V2,...; e.g. --grid \"lr=1e-4,3e-4 lora_rank=4,8\"", item);
        Axis a;
        a.key = item.substr(0, eq);
        a.flag = "--" + a.key;
        std::replace(a.flag.begin(), a.flag.end(), '_', '-');
        ANVIL_CHECK(train.get_option_no_throw(a.flag), "--grid: \"{}\" is not an anvil train flag ({}); see anvil "
                    "train --help", a.key, a.flag);
        ANVIL_CHECK(a.flag != "--out" && a.flag != "--resume", "--grid: {} is the sweep's to set", a.flag);
        std::stringstream vs(item.substr(eq + 1));
        std::string v;
        while (std::getline(vs, v, ','))
            if (!v.empty()) a.values.push_back(v);
        ANVIL_CHECK(!a.values.empty(), "--grid: {} has no values", a.key);
        for (const Axis& b : axes) ANVIL_CHECK(b.key != a.key, "--grid: {} is given twice", a.key);
        axes.push_back(a);
    }
    ANVIL_CHECK(!axes.empty(), "--grid: empty; give KEY=V1,V2,... pairs separated by spaces");
    return axes;
}

struct Point {
    std::vector<std::string> values;  // one per axis
    std::string dir;
};

std::vector<Point> combinations(const std::vector<Axis>& axes, const std::string& out) {
    std::vector<Point> pts(1);
    for (const Axis& a : axes) {
        std::vector<Point> next;
        for (const Point& p : pts)
            for (const std::string& v : a.values) {
                Point q = p;
                q.values.push_back(v);
                next.push_back(q);
            }
        pts = next;
    }
    for (size_t i = 0; i < pts.size(); i++) {
        std::string name = fmt::format("run-{:03d}", i);
        for (size_t k = 0; k < axes.size(); k++) name += "-" + axes[k].key + "=" + pts[i].values[k];
        for (char& c : name)
            if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '=' && c != '.' && c != '_') c = '_';
        pts[i].dir = out + "/" + name;
    }
    return pts;
}

// Starts `anvil train ...` with its output in LOG; returns the child's pid.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
    const pid_t pid = ::fork();
    ANVIL_CHECK(pid >= 0, "sweep: cannot start a process ({})", std::strerror(errno));
    if (pid == 0) {
        FILE* f = std::fopen(log.c_str(), "a");
        if (f) {
            ::dup2(::fileno(f), 1);
            ::dup2(::fileno(f), 2);
        }
        std::vector<char*> argv;
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv("/proc/self/exe", argv.data());
        std::_Exit(127);
    }
    return pid;
}

std::string value_of(const nlohmann::json& j, const char* key, const char* fmt_spec) {
    if (!j.contains(key) || !j[key].is_number()) return "";
    return fmt::format(fmt::runtime(fmt_spec), j[key].get<double>());
}

// The table: one row per run, the varied values then the results.
void write_tables(const std::vector<Axis>& axes, const std::vector<Point>& pts, const std::string& out) {
    std::vector<nlohmann::json> sums;
    for (const Point& p : pts) {
        const std::string sp = p.dir + "/summary.json";
        sums.push_back(file_exists(sp) ? read_json_file(sp) : nlohmann::json::object());
    }
    std::vector<std::pair<std::string, const char*>> cols = {
        {"train_loss", "{:.4f}"},   {"val_loss", "{:.4f}"},    {"exact_match", "{:.4f}"},
        {"tokens_per_s", "{:.0f}"}, {"peak_mem_mb", "{:.0f}"}, {"peak_rss_mb", "{:.0f}"},
        {"wall_s", "{:.1f}"},       {"cost_usd", "{:.4f}"}};
    if (std::any_of(sums.begin(), sums.end(), [](const nlohmann::json& s) { return s.contains("mc_acc"); }))
        cols.insert(cols.begin() + 3, {{"mc_acc", "{:.4f}"}, {"mc_acc_norm", "{:.4f}"}});  // --eval-choices
    std::vector<std::vector<std::string>> rows(1, {"run"});
    for (const Axis& a : axes) rows[0].push_back(a.key);
    for (const auto& c : cols) rows[0].push_back(c.first);
    rows[0].push_back("status");
    for (size_t i = 0; i < pts.size(); i++) {
        const Point& p = pts[i];
        const nlohmann::json& s = sums[i];
        std::vector<std::string> row = {std::filesystem::path(p.dir).filename().string()};
        row.insert(row.end(), p.values.begin(), p.values.end());
        for (const auto& [key, spec] : cols) row.push_back(value_of(s, key.c_str(), spec));
        row.push_back(s.empty() ? "failed" : "done");
        rows.push_back(row);
    }
    std::string csv, md;
    for (size_t r = 0; r < rows.size(); r++) {
        for (size_t c = 0; c < rows[r].size(); c++) {
            csv += (c ? "," : "") + rows[r][c];
            md += (c ? " " : "| ") + rows[r][c] + " |";
        }
        csv += "\n";
        md += "\n";
        if (r == 0) {
            for (size_t c = 0; c < rows[r].size(); c++) md += c ? " --- |" : "| --- |";
            md += "\n";
        }
    }
    write_file_atomic(out + "/sweep.csv", csv);
    write_file_atomic(out + "/sweep.md", md);
}

// Validation loss (where the runs evaluated during training, else training loss) of every run, overlaid.
void write_plot(const std::vector<Axis>& axes, const std::vector<Point>& pts, const std::string& out) {
    std::string script = fmt::format(
        "set terminal pngcairo size 1200,700 font ',10' noenhanced\nset output '{}/sweep.png.tmp'\nset grid\n"
        "set key outside "
        "right\nset xlabel 'step'\nset ylabel 'loss'\nset title 'sweep: loss per run (validation where "
        "evaluated, else training)'\nplot ",
        out);
    std::vector<std::string> dats;
    for (const Point& p : pts) {
        const std::string metrics = p.dir + "/metrics.jsonl";
        if (!file_exists(metrics)) continue;
        std::string train, val;
        std::ifstream in(metrics);
        std::string line;
        while (std::getline(in, line)) {
            if (line.empty()) continue;
            const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
            if (r.is_discarded() || !r.contains("step")) continue;
            if (r.contains("loss") && r["loss"].is_number())
                train += fmt::format("{} {}\n", r["step"].get<int>(), r["loss"].get<double>());
            if (r.contains("val_loss"))
                val += fmt::format("{} {}\n", r["step"].get<int>(), r["val_loss"].get<double>());
        }
        const nlohmann::json s = file_exists(p.dir + "/summary.json") ? read_json_file(p.dir + "/summary.json")
                                                                      : nlohmann::json::object();
        if (!val.empty() && s.contains("val_loss") && s.contains("steps"))
            val += fmt::format("{} {}\n", s["steps"].get<int>(), s["val_loss"].get<double>());
        const std::string dat = p.dir + "/sweep_curve.dat";
        write_file_atomic(dat, val.empty() ? train : val);
        dats.push_back(dat);
        std::string title;
        for (size_t k = 0; k < axes.size(); k++) title += (k ? " " : "") + axes[k].key + "=" + p.values[k];
        script += fmt::format("{}'{}' using 1:2 with linespoints lw 2 title '{}'", dats.size() > 1 ? ", " : "", dat,
                              title);
    }
    if (dats.empty()) return;
    script += "\n";
    FILE* gp = ::popen("gnuplot 2>&1", "w");
    ANVIL_CHECK(gp, "cannot start gnuplot (apt-get install gnuplot-nox)");
    std::fwrite(script.data(), 1, script.size(), gp);
    const int status = ::pclose(gp);
    for (const auto& d : dats) std::filesystem::remove(d);
    ANVIL_CHECK(status == 0 && file_exists(out + "/sweep.png.tmp"), "gnuplot failed (exit {}) drawing {}/sweep.png",
                status, out);
    std::filesystem::rename(out + "/sweep.png.tmp", out + "/sweep.png");
}

struct SweepOptions {
    std::string grid, out = "sweep";
    int parallel = 1;
    std::vector<std::string> train;  // the flags every run gets
};

int run_sweep(const SweepOptions& o, const CLI::App& train_app) {
    const std::vector<Axis> axes = parse_grid(o.grid, train_app);
    for (const std::string& f : o.train)
        ANVIL_CHECK(f != "--out" && f != "--resume", "sweep: {} after -- is the sweep's to set; drop it", f);
    // a flag the grid varies overrides the same flag among the shared ones
    std::vector<std::string> shared;
    for (size_t i = 0; i < o.train.size(); i++) {
        const std::string& a = o.train[i];
        const auto varied = std::find_if(axes.begin(), axes.end(), [&](const Axis& x) {
            return a == x.flag || a.starts_with(x.flag + "=");
        });
        if (varied == axes.end()) {
            shared.push_back(a);
            continue;
        }
        if (a == varied->flag && i + 1 < o.train.size() && !o.train[i + 1].starts_with("--")) i++;  // its value
    }
    make_dirs(o.out);
    const std::vector<Point> pts = combinations(axes, o.out);
    const bool threads_given = std::find(shared.begin(), shared.end(), "--threads") != shared.end();
    const int threads = std::max(1, int(std::thread::hardware_concurrency()) / o.parallel);
    std::map<pid_t, size_t> running;
    size_t next = 0, failed = 0;
    auto wait_one = [&] {
        int status = 0;
        const pid_t pid = ::wait(&status);
        const size_t i = running.at(pid);
        running.erase(pid);
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        failed += !ok;
        std::printf("sweep: %s %s\n", pts[i].dir.c_str(), ok ? "done" : fmt::format("failed (see {}.log)", pts[i].dir).c_str());
        std::fflush(stdout);
    };
    for (; next < pts.size(); next++) {
        const Point& p = pts[next];
        if (file_exists(p.dir + "/summary.json")) {
            std::printf("sweep: %s finished earlier; skipped\n", p.dir.c_str());
            continue;
        }
        std::vector<std::string> args = {"anvil", "train"};
        if (file_exists(p.dir + "/metrics.jsonl")) {
            args.insert(args.end(), {"--resume", p.dir});  // interrupted: continue it
        } else {
            args.insert(args.end(), shared.begin(), shared.end());
            for (size_t k = 0; k < axes.size(); k++) args.insert(args.end(), {axes[k].flag, p.values[k]});
            args.insert(args.end(), {"--out", p.dir});
            if (!threads_given && o.parallel > 1) args.insert(args.end(), {"--threads", std::to_string(threads)});
        }
        while (int(running.size()) >= o.parallel) wait_one();
        std::printf("sweep: %s started\n", p.dir.c_str());
        std::fflush(stdout);  // before fork: the child must not print it again
        std::fflush(stderr);
        running[spawn(args, p.dir + ".log")] = next;
    }
    while (!running.empty()) wait_one();
    write_tables(axes, pts, o.out);
    write_plot(axes, pts, o.out);
    std::printf("sweep: %zu runs, %zu failed; wrote %s/sweep.csv, sweep.md, sweep.png\n", pts.size(), failed,
                o.out.c_str());
    return failed ? 1 : 0;
}

}  // namespace

Command add_sweep(CLI::App& app, const CLI::App& train) {
    CLI::App* sub = app.add_subcommand(
        "sweep", "train every combination of a grid of flags; one table and one plot of the results");
    auto o = std::make_shared<SweepOptions>();
    sub->add_option("--grid", o->grid, "KEY=V1,V2,... pairs separated by spaces, keys are train flags: "
                    "\"lr=1e-4,3e-4 lora_rank=4,8\"")->required();
    sub->add_option("--out", o->out, "the sweep directory: one run directory per combination, sweep.csv, "
                    "sweep.md, sweep.png")->capture_default_str();
    sub->add_option("--parallel", o->parallel, "runs at once (each gets cores / parallel threads)")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("train_flags", o->train, "after --: the anvil train flags every run shares");
    const CLI::App* train_app = &train;
    return {sub, [o, train_app]() { return run_sweep(*o, *train_app); }};
}

}  // namespace anvil::cli
