// Which anvil this is: the project version and the commit the binary was built from, for --version, anvil
// doctor and a run's summary.json. Defined in a source the build generates (cmake/version.cmake).
#pragma once

namespace anvil {

const char* version_string();  // "0.1.0 (commit 0123456789ab, 2026-11-26)"; "-dirty" after a changed tree

}  // namespace anvil
