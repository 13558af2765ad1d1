// Package doctest runs the shell commands of the repository's Markdown documents, so that a
// README that cannot be followed top to bottom fails `make test`.
//
// Every fenced block of README.md, CONTRIBUTING.md and docs/*.md is one of:
//
//   - ```sh (or bash, shell): commands. The blocks of one document run in order, in one bash
//     process (so variables and background jobs carry from block to block) with -euo pipefail,
//     in a fresh directory, and every command must succeed;
//   - ```text or ```json: output, a diagram, a listing or a wire shape, never run;
//   - anything else (```go, ```yaml, ...) or an sh block that cannot run in CI: preceded by the
//     line `<!-- doctest: skip REASON -->`, REASON saying why (a Docker daemon, minutes of
//     benchmark, a fragment that an Example runs).
//
// A block that is none of these (no language, or another language with no annotation) fails
// the test, so a new block is either run or explained.
//
// The documents are written for a person at the top of a checkout, so the test gives the
// commands one: a fresh temporary directory with bin/rollout (built by the test from the
// checkout, which `make build` would build) and with HOME, XDG_RUNTIME_DIR and XDG_STATE_HOME
// inside it, `rollout` on PATH, and a `make` that answers `make build` (bin/rollout is there)
// and refuses any other target. The substitution it makes in the text is small and the same
// for every document: each of the well-known ports the docs use (6379 for Redis, 8000-8002
// for servers, 8100 for the weight store) becomes a free port, wherever it appears as a
// number of its own. A command's output must not hold the HTTP API's JSON error shape
// ({"error": {...}}), since curl exits 0 on an HTTP error. When the blocks of a document
// finish, every process they left running is stopped.
//
// It lives in the tools module so `make test` runs it after the main module's tests.
package doctest
