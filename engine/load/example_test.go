package load_test

import (
	"fmt"
	"log"

	"github.com/rolloutkit/rollout/engine/load"
)

// Open a model spec: here the tiny builtin, which needs no files (a directory opens a Hugging
// Face checkpoint, a .bin file a llama2.c one), and tokenize with its tokenizer.
func ExampleOpen() {
	m, err := load.Open(load.DefaultSpec, "")
	if err != nil {
		log.Fatal(err)
	}
	c := m.Weights.Config
	fmt.Println(m.Spec, "layers:", c.NumHiddenLayers, "vocab:", c.VocabSize)
	ids, err := m.Tokenizer.Encode("hi")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ids)
	// Output:
	// builtin:tiny layers: 2 vocab: 259
	// [104 105]
}
