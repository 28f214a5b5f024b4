// anvil: one binary, one subcommand per job (cli/app.cpp).
#include <string>
#include <vector>

#include "cli/commands.h"

int main(int argc, char** argv) {
    return anvil::cli::run_anvil(std::vector<std::string>(argv + 1, argv + argc));
}
