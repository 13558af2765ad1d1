package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/server/embedded"
	"github.com/rolloutkit/rollout/weightstore"
)

// startFleet starts two embedded servers (s0 and s1) in this process and dials them: what
// the examples below run against. Against `rollout serve` processes only Dial's options
// change.
func startFleet(ctx context.Context) (*embedded.Fleet, *sdk.Client) {
	fleet, err := embedded.Start(ctx, embedded.Options{Servers: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	c, err := sdk.Dial(ctx, fleet.DialOptions())
	if err != nil {
		log.Fatal(err)
	}
	return fleet, c
}

// printResults prints each server's result of a control call.
func printResults(op string, results []sdk.ServerResult, err error) {
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range results {
		fmt.Printf("%s %s: ok=%v version=%d\n", op, r.ServerID, r.OK(), r.WeightVersion)
	}
}

func ExampleDial() {
	ctx := context.Background()
	fleet, err := embedded.Start(ctx, embedded.Options{Servers: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer fleet.Close()
	// Against a real fleet: sdk.Options{Redis: redisconf.Config{URL: "redis://host:6379"}, Fleet: "demo", Secret: secret}.
	c, err := sdk.Dial(ctx, fleet.DialOptions())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("fleet:", c.Fleet())

	// A bad option is refused before anything is dialled.
	_, err = sdk.Dial(ctx, sdk.Options{})
	fmt.Println(errors.Is(err, sdk.ErrInvalid))
	// Output:
	// fleet: embedded
	// true
}

func ExampleClient_Status() {
	ctx := context.Background()
	fleet, c := startFleet(ctx)
	defer fleet.Close()
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range st {
		fmt.Printf("%s: %s, in rotation %v, version %d\n", s.ID, s.State, s.InRotation, s.WeightVersion)
	}
	// Output:
	// s0: running, in rotation true, version 0
	// s1: running, in rotation true, version 0
}

func ExampleClient_Generate() {
	ctx := context.Background()
	fleet, c := startFleet(ctx)
	defer fleet.Close()
	defer c.Close()
	seed := int64(7)
	out, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: []int{72, 105}, N: 4,
		Sampling: sdk.SamplingParams{MaxTokens: 6, Temperature: 1, IgnoreEOS: true, Seed: &seed}})
	if err != nil {
		log.Fatal(err)
	}
	// A group goes to one server; every token carries its logprob and weight version.
	s := out.Samples[0]
	fmt.Println(len(out.Samples), "samples;", len(s.Tokens), "tokens each; finish:", s.FinishReason)
	fmt.Println("versions:", s.WeightVersions(), "logprobs <= 0:", s.Tokens[0].Logprob <= 0)

	// Bad input is refused before it reaches a server.
	_, err = c.Generate(ctx, sdk.GenerateRequest{})
	fmt.Println(errors.Is(err, sdk.ErrInvalid))
	// Output:
	// 4 samples; 6 tokens each; finish: length
	// versions: [0 0 0 0 0 0] logprobs <= 0: true
	// true
}

func ExampleClient_UpdateWeights() {
	ctx := context.Background()
	fleet, c := startFleet(ctx)
	defer fleet.Close()
	defer c.Close()
	dir, err := os.MkdirTemp("", "rollout-example-store")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := weightstore.Open(ctx, dir)
	if err != nil {
		log.Fatal(err)
	}
	ws, err := weightstore.Serve("127.0.0.1:0", store)
	if err != nil {
		log.Fatal(err)
	}
	defer ws.Close(ctx)

	w, err := model.Preset("tiny", 2) // the trained weights
	if err != nil {
		log.Fatal(err)
	}
	ref, err := ws.Publish(ctx, 1, w) // trained weights to an sdk.WeightsRef in one call
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.UpdateWeights(ctx, ref, sdk.Plan{Policy: sdk.AllOrNothing})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("version %d: %s\n", res.Version, res.Outcome)
	for _, su := range res.Servers {
		fmt.Printf("%s: staged %v, committed %v\n", su.ServerID, su.Staged, su.Committed)
	}

	// A ref without a source is refused before the fleet is touched.
	_, err = c.UpdateWeights(ctx, sdk.WeightsRef{Version: 2}, sdk.Plan{})
	fmt.Println(errors.Is(err, sdk.ErrInvalid))
	// Output:
	// version 1: committed
	// s0: staged true, committed true
	// s1: staged true, committed true
	// true
}

func ExampleClient_Pause() {
	ctx := context.Background()
	fleet, c := startFleet(ctx)
	defer fleet.Close()
	defer c.Close()
	// A fleet pause is recorded in the desired state first: a server that restarts stays
	// paused until Resume.
	results, err := c.Pause(ctx, sdk.PauseOptions{Mode: sdk.PauseKeep, ClearCache: true})
	printResults("pause", results, err)
	d, err := c.DesiredState(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("desired paused:", d.Paused)
	results, err = c.Resume(ctx, sdk.ResumeOptions{})
	printResults("resume", results, err)

	// A target that is not a live server is refused before anything is sent.
	_, err = c.Pause(ctx, sdk.PauseOptions{Call: sdk.Call{Targets: []string{"s9"}}})
	fmt.Println(errors.Is(err, sdk.ErrNoServers))
	// Output:
	// pause s0: ok=true version=0
	// pause s1: ok=true version=0
	// desired paused: true
	// resume s0: ok=true version=0
	// resume s1: ok=true version=0
	// true
}

func ExampleClient_Sleep() {
	ctx := context.Background()
	fleet, c := startFleet(ctx)
	defer fleet.Close()
	defer c.Close()
	// Release the KV cache of one server (the default level, 1), then restore it. Targets
	// leave the fleet's desired state alone, so the server resumes with a targeted Resume.
	one := sdk.Call{Targets: []string{"s1"}}
	results, err := c.Sleep(ctx, sdk.SleepOptions{Call: one})
	printResults("sleep", results, err)
	results, err = c.WakeUp(ctx, sdk.WakeOptions{Call: one})
	printResults("wake", results, err)
	results, err = c.Resume(ctx, sdk.ResumeOptions{Call: one})
	printResults("resume", results, err)
	// Output:
	// sleep s1: ok=true version=0
	// wake s1: ok=true version=0
	// resume s1: ok=true version=0
}

func ExampleClient_ResetCache() {
	ctx := context.Background()
	fleet, c := startFleet(ctx)
	defer fleet.Close()
	defer c.Close()
	results, err := c.ResetCache(ctx, sdk.ResetOptions{ResetExternal: true})
	printResults("reset", results, err)
	// Output:
	// reset s0: ok=true version=0
	// reset s1: ok=true version=0
}

func ExampleClient_Abort() {
	ctx := context.Background()
	fleet, c := startFleet(ctx)
	defer fleet.Close()
	defer c.Close()
	// Finish the named requests with finish reason abort wherever they run (here none is
	// running: the servers ack all the same).
	results, err := c.Abort(ctx, sdk.AbortOptions{RequestIDs: []string{"req-1"}})
	printResults("abort", results, err)
	_, err = c.Abort(ctx, sdk.AbortOptions{RequestIDs: []string{""}})
	fmt.Println(errors.Is(err, sdk.ErrInvalid))
	// Output:
	// abort s0: ok=true version=0
	// abort s1: ok=true version=0
	// true
}
