package sdk_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/server/embedded"
)

// A multi-turn episode as a session: the first prompt rendered by the fleet from messages and
// tools, model turns and a tool result appended as token ids, every turn on the session's
// server, and the trajectory exported with its loss mask for the trainer
// (trainer.Sample{Prompt: tj.Prompt, Completion: tj.Completion, Logprobs: tj.Logprobs,
// Versions: tj.Versions, LossMask: tj.LossMask, Reward: r, Group: g}).
func ExampleClient_NewSession() {
	ctx := context.Background()
	fleet, err := embedded.Start(ctx, embedded.Options{Servers: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer fleet.Close()
	c, err := sdk.Dial(ctx, fleet.DialOptions())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	tools := []sdk.Tool{{Type: "function", Function: sdk.ToolFunction{Name: "add", Description: "Add two integers."}}}
	prompt, err := c.Tokenize(ctx, sdk.TokenizeRequest{Messages: []sdk.ChatMessage{{Role: "user", Content: "What is 2+3?"}}, Tools: tools})
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.NewSession(prompt, sdk.SessionOptions{
		Sampling: sdk.SamplingParams{MaxTokens: 8, IgnoreEOS: true},
		Decode:   c.Detokenize, // parse each turn's tool calls with the fleet's tokenizer
	})
	if err != nil {
		log.Fatal(err)
	}
	first, err := s.Generate(ctx, sdk.TurnOptions{})
	if err != nil {
		log.Fatal(err)
	}
	// ... run first.ToolCalls (this untrained model makes none), then give the result back:
	if err := s.AppendText(ctx, "\n<tool_response>\n5\n</tool_response>\n"); err != nil {
		log.Fatal(err)
	}
	second, err := s.Generate(ctx, sdk.TurnOptions{})
	if err != nil {
		log.Fatal(err)
	}
	tj := s.Trajectory()
	fmt.Println("one server for the episode:", first.Sample.Servers[0] == second.Sample.Servers[0])
	fmt.Println("turn 1 reused the KV of turn 0:", second.Sample.NumCachedTokens >= len(prompt)/16*16)
	fmt.Printf("%d model tokens (loss mask 1), %d environment tokens (loss mask 0)\n", tj.ModelTokens, len(tj.Completion)-tj.ModelTokens)
	// Output:
	// one server for the episode: true
	// turn 1 reused the KV of turn 0: true
	// 16 model tokens (loss mask 1), 36 environment tokens (loss mask 0)
}
