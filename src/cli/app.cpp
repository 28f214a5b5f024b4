// The anvil command line: one subcommand per job. Library code throws anvil::Error; this is the only place
// that turns an error into a message and an exit status (the binary's main()), or hands it to a caller that
// embeds the command line (the Python layer) as the exception it is.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/version.h"

namespace {

using anvil::cli::Command;

// Every command takes its flags from a JSON file too (--config), applied before it runs. With one, a required
// flag may come from the file: it is checked once the file is in.
void add_config_files(std::vector<Command>& cmds, bool with_config) {
    using namespace anvil::cli;
    for (Command& c : cmds) {
        auto path = std::make_shared<std::string>();
        // the command's own flags: `anvil data prepare`'s, not `anvil data`'s
        const auto kids = c.app->get_subcommands([](CLI::App*) { return true; });
        CLI::App* leaf = kids.size() == 1 ? kids[0] : c.app;
        add_config_flag(leaf, *path);
        std::vector<CLI::Option*> required;
        for (CLI::Option* o : leaf->get_options())
            if (with_config && o->get_required()) required.push_back(o->required(false));
        c.run = [path, app = leaf, required, run = std::move(c.run)]() {
            if (!path->empty()) {
                const int n = apply_config_file(*app, *path);
                std::fprintf(stderr, "anvil: --config %s: %d flag%s (the command line's own flags win)\n",
                             path->c_str(), n, n == 1 ? "" : "s");
            }
            for (const CLI::Option* o : required)
                ANVIL_CHECK(o->count() > 0, "{} is required: give it on the command line or in --config {}",
                            o->get_name(), *path);
            return run();
        };
    }
}

// A parse error as `anvil SUB: error: ...; see anvil SUB --help` (exit 2; thrown as an InputError with that
// message when embedded), or the help of a command given without its subcommand
int parse_error(const CLI::App& app, const CLI::ParseError& e, int argc, bool throw_errors) {
    std::string sub;
    const CLI::App* where = &app;
    for (auto* s : app.get_subcommands()) {
        sub = " " + s->get_name();
        where = s;
        for (auto* s2 : s->get_subcommands()) sub += " " + s2->get_name(), where = s2;
    }
    if (std::string(e.what()).find("subcommand is required") != std::string::npos) {
        // `anvil` or `anvil data` alone: show what there is to run
        std::printf("%s", where->help().c_str());
        return argc == 1 ? 0 : 2;
    }
    if (throw_errors)
        throw anvil::InputError(fmt::format("anvil{}: {}; see anvil{} --help", sub, e.what(), sub));
    std::fprintf(stderr, "anvil%s: error: %s; see anvil%s --help\n", sub.c_str(), e.what(), sub.c_str());
    return 2;
}

// "data prepare": the command's path below `anvil`
std::string command_path(const CLI::App* a) {
    std::string p = a->get_name();
    for (const CLI::App* up = a->get_parent(); up && up->get_parent(); up = up->get_parent())
        p = up->get_name() + " " + p;
    return p;
}

const CLI::App* top_command(const CLI::App* a) {
    while (a->get_parent() && a->get_parent()->get_parent()) a = a->get_parent();
    return a;
}

// The parsed command, run: an error becomes its message and exit status 1, or goes to the embedding caller
int run_command(const std::vector<Command>& cmds, bool throw_errors) {
    for (const auto& [cmd, run] : cmds) {
        if (!cmd->parsed()) continue;
        const std::string name = command_path(cmd);
        if (throw_errors) return run();
        try {
            return run();
        } catch (const anvil::Error& e) {
            std::fflush(stdout);
            std::fprintf(stderr, "\nanvil %s: error: %s\n", name.c_str(), e.what());
            return 1;
        } catch (const std::bad_alloc&) {
            std::fprintf(stderr, "\nanvil %s: error: out of memory; use a smaller model, batch or --seq\n",
                         name.c_str());
            return 1;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "\nanvil %s: error: %s\n", name.c_str(), e.what());
            return 1;
        }
    }
    return 0;
}

}  // namespace

namespace anvil::cli {

int run_anvil(const std::vector<std::string>& args, const Embedding& embed) {
    // CLI11 parses an argv: the program's name, then the arguments
    std::vector<const char*> argv_v = {"anvil"};
    for (const std::string& a : args) argv_v.push_back(a.c_str());
    const int argc = int(argv_v.size());
    const char* const* argv = argv_v.data();
    CLI::App app{
        "anvil: pretrain, fine-tune, evaluate, sample and serve GPT-2 and Llama style language models"};
    app.require_subcommand(1, 1);
    app.set_help_all_flag("--help-all", "help for every subcommand");
    app.set_version_flag("--version", std::string("anvil ") + anvil::version_string(),
                         "print the version and the commit this binary was built from");
    std::vector<Command> cmds = {add_train(app, embed.train_hooks),
                                 add_plan(app),
                                 add_eval(app),
                                 add_generate(app),
                                 add_tokenize(app),
                                 add_tokenizer(app),
                                 add_data(app),
                                 add_doctor(app),
                                 add_bench(app),
                                 add_plot(app),
                                 add_lora(app),
                                 add_quantize(app),
                                 add_convert(app),
                                 add_export(app),
                                 add_serve(app),
                                 add_compare(app)};
    cmds.push_back(add_sweep(app, *cmds[0].app));
    cmds.push_back(add_dedup(app.get_subcommand("data")));
    cmds.push_back(add_pseudo_label(app.get_subcommand("data")));
    cmds.push_back(add_filter(app.get_subcommand("data")));
    cmds.push_back(add_synth(app.get_subcommand("data")));
    cmds.push_back(add_augment(app.get_subcommand("data")));
    add_config_files(cmds, std::any_of(argv + 1, argv + argc, [](const char* a) {
                         return std::string_view(a) == "--config" ||
                                std::string_view(a).starts_with("--config=");
                     }));
    if (argc > 1 && argv[1][0] != '-') {
        bool known = false;
        for (const auto& c : cmds) known = known || top_command(c.app)->get_name() == argv[1];
        if (!known) {
            if (embed.throw_errors)
                throw InputError(
                    fmt::format("unknown command \"{}\"; see anvil --help for the commands", argv[1]));
            std::fprintf(stderr, "anvil: error: unknown command \"%s\"; see anvil --help for the commands\n",
                         argv[1]);
            return 2;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        return parse_error(app, e, argc, embed.throw_errors);
    }
    return run_command(cmds, embed.throw_errors);
}

}  // namespace anvil::cli
