// A plugin that registers no stage type: load_plugin refuses it with one line
// (tests/CMakeLists.txt: Cli.Plugin.*).
int flowtrain_test_plugin_without_stages() { return 0; }
