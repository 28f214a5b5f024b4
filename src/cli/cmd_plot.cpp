// anvil plot RUN_DIR...: loss (train and validation), learning rate, tokens/s and utilisation over steps,
// drawn by gnuplot into a PNG or SVG. Several runs share the panels, and the fourth shows each run's training
// loss relative to the first run's at the same step (a comparison: precisions, implementations,
// hyperparameters).
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "io/fs.h"

namespace anvil::cli {

namespace {

bool on_path(const char* prog) {
    const char* path = std::getenv("PATH");
    std::stringstream ss(path ? path : "");
    std::string dir;
    while (std::getline(ss, dir, ':'))
        if (!dir.empty() && ::access((dir + "/" + prog).c_str(), X_OK) == 0) return true;
    return false;
}

// gnuplot reads '?' as a missing value
std::string num(const nlohmann::json& r, const char* key) {
    return r.contains(key) && r[key].is_number() ? fmt::format("{:.8g}", r[key].get<double>()) : "?";
}

struct Metrics {
    std::string name;  // the run directory's name: the curves' title
    std::vector<nlohmann::json> rows;
    std::string dat;               // its gnuplot data file
    std::array<int, 10> has = {};  // how many numbers each data column (1-based) holds
};

Metrics read_metrics(const std::string& run) {
    const std::string path = run + "/metrics.jsonl";
    ANVIL_CHECK(file_exists(path), "{}: no metrics.jsonl; give a run directory written by anvil train", run);
    Metrics m;
    m.name = std::filesystem::path(run).lexically_normal().filename().string();
    if (m.name.empty())
        m.name = std::filesystem::path(run).lexically_normal().parent_path().filename().string();
    std::ifstream in(path);
    std::string line;
    for (size_t lineno = 1; std::getline(in, line); lineno++) {
        if (line.empty()) continue;
        try {
            m.rows.push_back(nlohmann::json::parse(line));
        } catch (const nlohmann::json::exception& e) {
            fail("{}:{}: not valid JSON ({})", path, lineno, e.what());
        }
    }
    ANVIL_CHECK(!m.rows.empty(), "{}: empty; nothing to plot", path);
    // the validation at the end of a run (--eval-every 0, the default) is only in summary.json
    nlohmann::json summary;
    if (file_exists(run + "/summary.json")) {
        try {
            summary = nlohmann::json::parse(read_file(run + "/summary.json"));
        } catch (const nlohmann::json::exception& e) {
            std::fprintf(stderr,
                         "anvil plot: %s/summary.json is not valid JSON (%s); its final validation loss "
                         "is left out\n",
                         run.c_str(), e.what());
        }
    }
    if (summary.contains("val_loss") && summary["val_loss"].is_number() && summary.contains("steps")) {
        auto& last = m.rows.back();
        if (!last.contains("val_loss") && last.value("step", -1.0) == summary["steps"].get<double>())
            last["val_loss"] = summary["val_loss"];
    }
    return m;
}

// One gnuplot data row per step: step loss val_loss lr tokens/s gpu_util cpu_util step_ms, then the loss
// relative to `ref`'s at the same step in percent ('?' where ref has no such step); notes which columns have
// data.
std::string data_rows(Metrics& m, const std::map<double, double>& ref) {
    std::string data;
    for (const auto& r : m.rows) {
        std::string cols[9] = {num(r, "step"),     num(r, "loss"),         num(r, "val_loss"),
                               num(r, "lr"),       num(r, "tokens_per_s"), num(r, "gpu_util"),
                               num(r, "cpu_util"), num(r, "step_ms"),      "?"};
        if (r.contains("step") && r.contains("loss") && r["loss"].is_number()) {
            const auto it = ref.find(r["step"].get<double>());
            if (it != ref.end() && it->second != 0.0)
                cols[8] = fmt::format("{:.8g}", 100.0 * (r["loss"].get<double>() - it->second) / it->second);
        }
        for (int c = 0; c < 9; c++) {
            m.has[size_t(c + 1)] += cols[c] != "?" && cols[0] != "?";
            data += cols[c] + (c < 8 ? " " : "\n");
        }
    }
    return data;
}

// gnuplot quotes titles in single quotes, which a title doubles
std::string quoted(std::string s) {
    for (size_t i = 0; (i = s.find('\'', i)) != std::string::npos; i += 2) s.insert(i, "'");
    return "'" + s + "'";
}

struct Curve {
    const Metrics* run;
    int col;
    std::string style, title;  // title "" = notitle
};

// One panel: its title and the curves whose column has data (gnuplot refuses a plot with no points).
std::string panel(const std::string& title, const std::vector<Curve>& curves, const char* yrange = nullptr) {
    std::string cmd;
    for (const auto& c : curves) {
        const int points = c.run->has[size_t(c.col)];
        if (points == 0) continue;
        // one point draws no line: mark it
        const std::string style = points == 1 && c.style.rfind("lines ", 0) == 0
                                      ? "linespoints pt 7 " + c.style.substr(6)
                                      : c.style;
        cmd +=
            fmt::format("{}{} using 1:{} with {} {}", cmd.empty() ? "plot " : ", ", quoted(c.run->dat), c.col,
                        style, c.title.empty() ? std::string("notitle") : "title " + quoted(c.title));
    }
    const std::string head =
        fmt::format("set title {}\n{}", quoted(title), yrange ? yrange : "set autoscale y\n");
    if (cmd.empty())
        return head +
               "set label 1 'no data' at graph 0.5, graph 0.5 center\nplot [0:1][0:1] -1 notitle\n"
               "unset label 1\n";
    return head + cmd + "\n";
}

// The four panels for one run or several.
std::string panels(const std::vector<Metrics>& runs) {
    if (runs.size() == 1) {
        const Metrics& r = runs[0];
        const int util = r.has[6] ? 6 : (r.has[7] ? 7 : 8);
        return panel("loss", {{&r, 2, "lines lw 2", "train"}, {&r, 3, "linespoints pt 7", "validation"}}) +
               panel("learning rate", {{&r, 4, "lines lw 2", ""}}) +
               panel("tokens/s", {{&r, 5, "lines lw 2", ""}}) +
               panel(
                   util == 6 ? "GPU utilisation (%)" : (util == 7 ? "CPU utilisation (%)" : "step time (ms)"),
                   {{&r, util, "lines lw 2", ""}}, util == 8 ? nullptr : "set yrange [0:105]\n");
    }
    // run k in line type k + 1 in every panel
    std::vector<Curve> loss, lr, tps, gap;
    for (size_t k = 0; k < runs.size(); k++) {
        const std::string lt = fmt::format(" lt {}", k + 1);
        loss.push_back({&runs[k], 2, "lines lw 2" + lt, runs[k].name});
        lr.push_back({&runs[k], 4, "lines lw 2" + lt, runs[k].name});
        tps.push_back({&runs[k], 5, "lines lw 2" + lt, runs[k].name});
        if (k > 0) gap.push_back({&runs[k], 9, "lines lw 1" + lt, runs[k].name});
    }
    for (size_t k = 0; k < runs.size(); k++)
        loss.push_back({&runs[k], 3, fmt::format("points pt 7 lt {}", k + 1), ""});
    return panel("training loss (points: validation)", loss) + panel("learning rate", lr) +
           panel("tokens/s", tps) + panel("training loss relative to " + runs[0].name + " (%)", gap);
}

int plot(const std::vector<std::string>& run_dirs, std::string out) {
    if (out.empty()) out = run_dirs[0] + (run_dirs.size() == 1 ? "/plot.png" : "/compare.png");
    const bool svg = out.ends_with(".svg");
    ANVIL_CHECK(svg || out.ends_with(".png"), "--out {}: the file name must end in .png or .svg", out);
    ANVIL_CHECK(on_path("gnuplot"),
                "anvil plot draws with gnuplot, which is not installed: apt-get install gnuplot-nox");
    std::vector<Metrics> runs;
    for (const auto& d : run_dirs) runs.push_back(read_metrics(d));
    std::map<double, double> ref;  // the first run's loss by step
    for (const auto& r : runs[0].rows)
        if (r.contains("step") && r.contains("loss") && r["loss"].is_number())
            ref[r["step"].get<double>()] = r["loss"].get<double>();
    size_t points = 0;
    for (size_t k = 0; k < runs.size(); k++) {
        runs[k].dat = fmt::format("{}.{}.dat.tmp", out, k);
        write_file_atomic(runs[k].dat, data_rows(runs[k], ref));
        points += runs[k].rows.size();
    }
    std::string title;
    for (const auto& r : runs) title += (title.empty() ? "" : " vs ") + r.name;
    const std::string tmp_out = out + ".tmp";
    const std::string script = fmt::format(
        "set terminal {} size 1200,800 font ',10'\nset output {}\nset datafile missing '?'\n"
        "set multiplot layout 2,2 title {}\nset grid\nset key top right\nset xlabel 'step'\n"
        "set offsets 0, graph 0.02, 0, 0\n{}unset multiplot\n",
        svg ? "svg dynamic" : "pngcairo", quoted(tmp_out), quoted(title), panels(runs));
    FILE* gp = ::popen("gnuplot 2>&1", "w");
    ANVIL_CHECK(gp, "cannot start gnuplot");
    std::fwrite(script.data(), 1, script.size(), gp);
    const int status = ::pclose(gp);
    for (const auto& r : runs) std::filesystem::remove(r.dat);
    ANVIL_CHECK(status == 0 && file_exists(tmp_out), "gnuplot failed (exit {}) drawing {}", status, out);
    std::filesystem::rename(tmp_out, out);
    std::printf("wrote %s (%zu points, %zu run%s)\n", out.c_str(), points, runs.size(),
                runs.size() == 1 ? "" : "s");
    return 0;
}

}  // namespace

Command add_plot(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("plot",
                                       "draw a run's loss, learning rate, tokens/s and utilisation; several "
                                       "runs: overlaid, with each run's loss "
                                       "relative to the first's");
    auto runs = std::make_shared<std::vector<std::string>>();
    auto out = std::make_shared<std::string>();
    sub->add_option("run", *runs, "run directories (each holds metrics.jsonl); the first is the reference")
        ->required();
    sub->add_option("--out", *out,
                    "output file, .png or .svg (default RUN/plot.png; several runs: FIRST_RUN/compare.png)");
    return {sub, [runs, out]() { return plot(*runs, *out); }};
}

}  // namespace anvil::cli
