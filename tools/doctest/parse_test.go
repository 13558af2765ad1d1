package doctest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	doc := "# T\n\n```sh\necho a\n```\n\n<!-- doctest: skip needs docker -->\n```sh\ndocker compose up\n```\n\n```text\nout\n```\n\n```\nbare\n```\n\n```go\nx := 1\n```\n"
	bs, err := Parse(doc)
	require.NoError(t, err)
	require.Len(t, bs, 5)
	kinds := []string{}
	for _, b := range bs {
		k, err := b.Kind()
		if err != nil {
			k = "error"
		}
		kinds = append(kinds, k)
	}
	require.Equal(t, []string{KindRun, KindSkipped, KindData, "error", "error"}, kinds)
	require.Equal(t, "echo a", bs[0].Body)
	require.Equal(t, 3, bs[0].Line)
	require.Equal(t, "needs docker", bs[1].Skip)

	for name, bad := range map[string]string{
		"unclosed":          "```sh\necho\n",
		"no reason":         "<!-- doctest: skip -->\n```sh\necho\n```\n",
		"not before fence":  "<!-- doctest: skip docker -->\n\n```sh\necho\n```\n",
		"unknown directive": "<!-- doctest: run -->\n```sh\necho\n```\n",
	} {
		_, err := Parse(bad)
		require.Error(t, err, name)
	}
}

func TestSubstitute(t *testing.T) {
	ports := map[int]int{8000: 41000, 8001: 41001, 6379: 42000}
	in := "for p in 8000 8001; do serve --addr 127.0.0.1:$p; done; redis://127.0.0.1:6379 localhost:8000/x 18000 80001 --port 6379"
	want := "for p in 41000 41001; do serve --addr 127.0.0.1:$p; done; redis://127.0.0.1:42000 localhost:41000/x 18000 80001 --port 42000"
	require.Equal(t, want, Substitute(in, ports))
}
