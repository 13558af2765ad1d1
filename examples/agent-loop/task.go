package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// The task: "47?" asks for the value the lookup tool holds under key 47. The values are
// random digits drawn once from a fixed seed, unrelated to the keys, so no policy can compute
// them: on a key it never trained on, the only way to the answer is the tool. An episode has
// up to two model turns, token ids throughout (byte-level vocabulary of the builtin presets):
//
//	prompt      BOS "47?"
//	turn 1      "@47" EOS      a tool call: '@' and a 2-digit key (model tokens, trained on)
//	tool        "=3\n"         the tool's result, appended by the environment (loss mask 0)
//	turn 2      "3" EOS        the answer (model tokens)
//
// A first turn that is not a well-formed call is the episode's answer (no tool used). The
// episode succeeds when the answer is the key's value and EOS. The reward is 0.5 for success
// and 0.25 for each digit of the call's key that matches the question's: the call has to copy
// the key before the tool can help.

// Keys are 00..99; 20 of them, chosen once with splitSeed, are held out of training.
const (
	numKeys   = 100
	heldOut   = 20
	splitSeed = 28
	tableSeed = 4
)

// Reward weights: success, and each matching key digit of the call.
const (
	rewardSuccess  = 0.5
	rewardKeyDigit = 0.25
)

// problem is one question.
type problem struct {
	Key    int
	Text   string // "47?"
	Prompt []int  // BOS, then the text's bytes
	Value  int    // the digit the tool holds under Key
}

// task holds the tool's table and the train/held-out split.
type task struct {
	bos, eos       int
	table          [numKeys]int
	Train, HeldOut []problem
}

func newTask(bos, eos int) *task {
	t := &task{bos: bos, eos: eos}
	r := rand.New(rand.NewPCG(tableSeed, 0))
	for k := range t.table {
		t.table[k] = r.IntN(10)
	}
	all := make([]problem, numKeys)
	for k := range all {
		text := fmt.Sprintf("%02d?", k)
		p := problem{Key: k, Text: text, Prompt: []int{bos}, Value: t.table[k]}
		for _, b := range []byte(text) {
			p.Prompt = append(p.Prompt, int(b))
		}
		all[k] = p
	}
	s := rand.New(rand.NewPCG(splitSeed, 0))
	s.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	t.HeldOut, t.Train = all[:heldOut], all[heldOut:]
	return t
}

// Turn budgets: a call is '@', two digits and EOS; an answer a digit and EOS. One token more
// each, so that a well-formed turn ends with "stop" and an overlong one with "length".
const (
	callTokens   = 5
	answerTokens = 3
)

// parseCall returns the key of a well-formed call: '@', two digits, EOS.
func (t *task) parseCall(turn []int) (key int, ok bool) {
	if len(turn) != 4 || turn[0] != '@' || turn[3] != t.eos || !digit(turn[1]) || !digit(turn[2]) {
		return 0, false
	}
	return (turn[1]-'0')*10 + turn[2] - '0', true
}

func digit(id int) bool { return id >= '0' && id <= '9' }

// toolResult is what the environment appends after a call of key: "=v\n".
func (t *task) toolResult(key int) []int {
	return []int{'=', '0' + t.table[key], '\n'}
}

// answerOK reports whether an answer turn is p's value and EOS.
func (t *task) answerOK(p problem, turn []int) bool {
	return len(turn) == 2 && turn[0] == '0'+p.Value && turn[1] == t.eos
}

// outcome is how an episode went.
type outcome struct {
	Called     bool // the first turn was a well-formed call
	KeyDigits  int  // digits of the call's key that match the question's (0..2)
	Success    bool // the answer is the value and EOS
	CallTurn   []int
	AnswerTurn []int
}

// reward scores an outcome in [0, 1].
func (o outcome) reward() float64 {
	r := rewardKeyDigit * float64(o.KeyDigits)
	if o.Success {
		r += rewardSuccess
	}
	return r
}

// score judges an episode from its model turns (the answer turn is nil when the first turn
// was not a call: the first turn is then the answer).
func (t *task) score(p problem, first, second []int) outcome {
	o := outcome{CallTurn: first, AnswerTurn: second}
	key, ok := t.parseCall(first)
	if !ok {
		o.AnswerTurn, o.CallTurn = first, nil
		o.Success = t.answerOK(p, first)
		return o
	}
	o.Called = true
	if key/10 == p.Key/10 {
		o.KeyDigits++
	}
	if key%10 == p.Key%10 {
		o.KeyDigits++
	}
	o.Success = t.answerOK(p, second)
	return o
}

// constantSuccess is the held-out success rate of the best constant answer without the tool.
func (t *task) constantSuccess() float64 {
	var n [10]int
	for _, p := range t.HeldOut {
		n[p.Value]++
	}
	return float64(slices.Max(n[:])) / float64(len(t.HeldOut))
}

// warmExamples are supervised examples of the episode format, standing in for pretraining:
// the policy learns what a call looks like and that an answer after a tool's result repeats
// it (what a pretrained model knows of tools), not which key to call, nor to call at all.
// Half are episodes with a call of a random key, its result and that result as the answer;
// half answer a random digit at once. Each model turn is its own example, so the tool's
// tokens are context, never a target (as the loss mask makes them in GRPO).
func (t *task) warmExamples(r *rand.Rand, n int) (prompts, completions [][]int) {
	for range n {
		p := t.Train[r.IntN(len(t.Train))]
		answer := []int{'0' + r.IntN(10), t.eos}
		if r.IntN(2) == 0 {
			prompts, completions = append(prompts, p.Prompt), append(completions, answer)
			continue
		}
		key := r.IntN(numKeys)
		call := []int{'@', '0' + key/10, '0' + key%10, t.eos}
		ctx := slices.Concat(p.Prompt, call, t.toolResult(key))
		answer[0] = '0' + t.table[key]
		prompts, completions = append(prompts, p.Prompt, ctx), append(completions, call, answer)
	}
	return prompts, completions
}

// render shows tokens as text (bytes, EOS as ⏎, newline as ↵, other ids as ⟨id⟩).
func (t *task) render(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		switch {
		case id == t.eos:
			b.WriteString("⏎")
		case id == '\n':
			b.WriteString("↵")
		case id >= 32 && id < 127:
			b.WriteByte(byte(id))
		default:
			fmt.Fprintf(&b, "⟨%d⟩", id)
		}
	}
	return b.String()
}
