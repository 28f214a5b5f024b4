// anvil: one binary, one subcommand per job. Library code throws anvil::Error; this is the only place that
// turns an error into a message and an exit status.
#include <cstdio>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/version.h"

int main(int argc, char** argv) {
    CLI::App app{
        "anvil: pretrain, fine-tune, evaluate, sample and serve GPT-2 and Llama style language models"};
    app.require_subcommand(1, 1);
    app.set_help_all_flag("--help-all", "help for every subcommand");
    app.set_version_flag("--version", std::string("anvil ") + anvil::version_string(),
                         "print the version and the commit this binary was built from");
    using namespace anvil::cli;
    std::vector<Command> cmds = {add_train(app),     add_eval(app), add_generate(app), add_tokenize(app),
                                 add_tokenizer(app), add_data(app), add_doctor(app),   add_bench(app),
                                 add_plot(app),      add_lora(app), add_quantize(app), add_convert(app),
                                 add_serve(app)};
    cmds.push_back(add_sweep(app, *cmds[0].app));
    if (argc > 1 && argv[1][0] != '-') {
        bool known = false;
        for (const auto& c : cmds) known = known || c.app->get_name() == argv[1];
        if (!known) {
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
        std::string sub;
        CLI::App* where = &app;
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
        std::fprintf(stderr, "anvil%s: error: %s; see anvil%s --help\n", sub.c_str(), e.what(), sub.c_str());
        return 2;
    }
    for (const auto& [cmd, run] : cmds) {
        if (!cmd->parsed()) continue;
        try {
            return run();
        } catch (const anvil::Error& e) {
            std::fflush(stdout);
            std::fprintf(stderr, "\nanvil %s: error: %s\n", cmd->get_name().c_str(), e.what());
            return 1;
        } catch (const std::bad_alloc&) {
            std::fprintf(stderr, "\nanvil %s: error: out of memory; use a smaller model, batch or --seq\n",
                         cmd->get_name().c_str());
            return 1;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "\nanvil %s: error: %s\n", cmd->get_name().c_str(), e.what());
            return 1;
        }
    }
    return 0;
}
