package engine_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
)

// Generate greedily from the tiny builtin model in-process: build the engine, run its loop,
// add a request and collect the result.
func Example() {
	w, err := model.Preset("tiny", 1)
	if err != nil {
		log.Fatal(err)
	}
	e, err := engine.New(engine.Config{Weights: w, WeightVersion: 1, NumBlocks: 64, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()

	p := sample.Defaults()
	p.Temperature, p.MaxTokens, p.IgnoreEOS = 0, 8, true
	s, err := e.Add(ctx, engine.Request{ID: "r1", PromptTokenIDs: []int{model.TinyBOS, 'h', 'i'}, Sampling: p})
	if err != nil {
		log.Fatal(err)
	}
	res, err := s.Collect(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(res.TokenIDs()), "tokens, finish reason", res.FinishReason, "on weights version", res.Tokens[0].WeightVersion)
	// Output: 8 tokens, finish reason length on weights version 1
}

// Pause the engine, release its KV cache with a level-1 sleep, wake it up and resume: what an
// RL trainer does around a weight update.
func ExampleEngine_Sleep() {
	ctx := context.Background()
	e, stop := runTiny()
	defer stop()

	if err := e.Sleep(ctx, 1, engine.PauseAbort); err != nil {
		log.Fatal(err)
	}
	st, err := e.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.State, "level", st.SleepLevel, "kv released:", st.KVReleased)
	if err := e.WakeUp(ctx, nil); err != nil { // nil: every part
		log.Fatal(err)
	}
	st, err = e.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.State, "kv released:", st.KVReleased)
	// Output:
	// sleeping level 1 kv released: true
	// running kv released: false
}

// runTiny starts an engine serving the tiny builtin model, as Example does, and returns it with
// the function that stops it.
func runTiny() (*engine.Engine, func()) {
	w, err := model.Preset("tiny", 1)
	if err != nil {
		log.Fatal(err)
	}
	e, err := engine.New(engine.Config{Weights: w, NumBlocks: 64, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	return e, func() { cancel(); <-done }
}
