// Command rollout is the Rollout command-line interface: it serves the engine, generates text
// in-process, drives a fleet through the SDK, manages model checkpoints and runs benchmarks.
//
// Every flag can also be set from the environment as ROLLOUT_<FLAG_IN_UPPER_SNAKE>
// (for example --max-tokens reads ROLLOUT_MAX_TOKENS); a flag given on the command line wins
// over the environment, which wins over the default. `rollout <command> --help` lists the names.
//
// Errors are printed to stderr as one line and the exit code is 1.
package main
