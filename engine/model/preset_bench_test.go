package model

import "testing"

// BenchmarkPreset generates each large preset's weights (fresh memory every time, as a
// process that builds one does): the wait before `rollout serve --model builtin:NAME` or
// `model init` can start. go test -run '^$' -bench Preset -benchtime 1x ./engine/model/
func BenchmarkPreset(b *testing.B) {
	for _, name := range []string{"qwen2.5-0.5b-shape", "llama3.2-1b-shape"} {
		b.Run(name, func(b *testing.B) {
			c, err := PresetConfig(name)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := Preset(name, 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(c.NumParams())*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mparams/s")
		})
	}
}
