// Package bench holds Rollout's benchmarks as library code, so that `rollout bench …` and
// `go test -bench` measure the same thing, each figure reported beside the baseline it is
// judged against, measured in the same run.
package bench
