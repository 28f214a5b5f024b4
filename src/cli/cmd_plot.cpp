// anvil plot RUN_DIR: loss (train and validation), learning rate, tokens/s and utilisation over steps, drawn
// by gnuplot into a PNG or SVG.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
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

int plot(const std::string& run, std::string out) {
    const std::string metrics = run + "/metrics.jsonl";
    ANVIL_CHECK(file_exists(metrics), "{}: no metrics.jsonl; give a run directory written by anvil train",
                run);
    if (out.empty()) out = run + "/plot.png";
    const bool svg = out.ends_with(".svg");
    ANVIL_CHECK(svg || out.ends_with(".png"), "--out {}: the file name must end in .png or .svg", out);
    ANVIL_CHECK(on_path("gnuplot"),
                "anvil plot draws with gnuplot, which is not installed: apt-get install gnuplot-nox");
    std::ifstream in(metrics);
    std::string line, data;
    size_t lineno = 0, rows = 0;
    bool gpu = false, cpu = false;
    while (std::getline(in, line)) {
        lineno++;
        if (line.empty()) continue;
        nlohmann::json r;
        try {
            r = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
            fail("{}:{}: not valid JSON ({})", metrics, lineno, e.what());
        }
        gpu = gpu || r.contains("gpu_util");
        cpu = cpu || r.contains("cpu_util");
        data += fmt::format("{} {} {} {} {} {} {} {}\n", num(r, "step"), num(r, "loss"), num(r, "val_loss"),
                            num(r, "lr"), num(r, "tokens_per_s"), num(r, "gpu_util"), num(r, "cpu_util"),
                            num(r, "step_ms"));
        rows++;
    }
    ANVIL_CHECK(rows > 0, "{}: empty; nothing to plot", metrics);
    const std::string dat = out + ".dat.tmp";
    write_file_atomic(dat, data);
    const std::string tmp_out = out + ".tmp";
    std::string script = fmt::format(
        "set terminal {} size 1200,800 font ',10'\nset output '{}'\nset datafile missing '?'\n"
        "set multiplot layout 2,2 title '{}'\nset grid\nset key top right\nset xlabel 'step'\n"
        "set title 'loss'\nplot '{}' using 1:2 with lines lw 2 title 'train', '' using 1:3 with linespoints "
        "pt 7 "
        "title 'validation'\n"
        "set title 'learning rate'\nplot '{}' using 1:4 with lines lw 2 notitle\n"
        "set title 'tokens/s'\nplot '{}' using 1:5 with lines lw 2 notitle\n"
        "set title '{}'\n{}plot '{}' using 1:{} with lines lw 2 notitle\n"
        "unset multiplot\n",
        svg ? "svg dynamic" : "pngcairo", tmp_out, std::filesystem::path(run).filename().string(), dat, dat,
        dat, gpu ? "GPU utilisation (%)" : (cpu ? "CPU utilisation (%)" : "step time (ms)"),
        gpu || cpu ? "set yrange [0:105]\n" : "", dat, gpu ? 6 : (cpu ? 7 : 8));
    FILE* gp = ::popen("gnuplot 2>&1", "w");
    ANVIL_CHECK(gp, "cannot start gnuplot");
    std::fwrite(script.data(), 1, script.size(), gp);
    const int status = ::pclose(gp);
    std::filesystem::remove(dat);
    ANVIL_CHECK(status == 0 && file_exists(tmp_out), "gnuplot failed (exit {}) drawing {}", status, out);
    std::filesystem::rename(tmp_out, out);
    std::printf("wrote %s (%zu points)\n", out.c_str(), rows);
    return 0;
}

}  // namespace

Command add_plot(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("plot", "draw a run's loss, learning rate, tokens/s and utilisation");
    auto run = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    sub->add_option("run", *run, "run directory (holds metrics.jsonl)")->required();
    sub->add_option("--out", *out, "output file, .png or .svg (default RUN/plot.png)");
    return {sub, [run, out]() { return plot(*run, *out); }};
}

}  // namespace anvil::cli
