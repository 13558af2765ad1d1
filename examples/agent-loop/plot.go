package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotRun draws the run: training reward and the batch's tool use, and the held-out success,
// tool use and right-key shares, with the initial policy's and the best constant answer's
// success as reference lines.
func plotRun(path, model string, sum *summary) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("GRPO on %s: a lookup tool, multi-turn episodes through the pipeline", model)
	p.X.Label.Text = "GRPO step"
	p.Y.Label.Text = "share / reward"
	p.Y.Min, p.Y.Max = 0, 1.45 // the legend sits above 1
	p.Y.Tick.Marker = plot.ConstantTicks{{Value: 0, Label: "0"}, {Value: 0.2, Label: "0.2"}, {Value: 0.4, Label: "0.4"},
		{Value: 0.6, Label: "0.6"}, {Value: 0.8, Label: "0.8"}, {Value: 1, Label: "1"}}
	p.Add(plotter.NewGrid())
	var reward, tool, success, evKey plotter.XYs
	if sum.Before != nil {
		success = append(success, plotter.XY{X: 0, Y: sum.Before.Success})
		evKey = append(evKey, plotter.XY{X: 0, Y: sum.Before.KeyRight})
	}
	for _, r := range sum.Records {
		x := float64(r.Step)
		reward, tool = append(reward, plotter.XY{X: x, Y: r.Reward}), append(tool, plotter.XY{X: x, Y: r.ToolUse})
		if r.EvalSuccess != nil {
			success = append(success, plotter.XY{X: x, Y: *r.EvalSuccess})
			evKey = append(evKey, plotter.XY{X: x, Y: *r.EvalKeyRight})
		}
	}
	xEnd := 1.0
	if n := len(sum.Records); n > 0 {
		xEnd = float64(sum.Records[n-1].Step)
	}
	add := func(name string, xy plotter.XYs, c color.Color, width float64, dashed, points bool) error {
		if len(xy) == 0 {
			return nil
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color, l.Width = c, vg.Points(width)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(name, l)
		if points {
			s, err := plotter.NewScatter(xy)
			if err != nil {
				return err
			}
			s.Color, s.Shape = c, draw.CircleGlyph{}
			p.Add(s)
		}
		return nil
	}
	ref := func(y float64) plotter.XYs { return plotter.XYs{{X: 0, Y: y}, {X: xEnd, Y: y}} }
	blue, green, grey, orange, red, purple := color.RGBA{31, 119, 180, 255}, color.RGBA{44, 160, 44, 255},
		color.RGBA{127, 127, 127, 255}, color.RGBA{255, 127, 14, 255}, color.RGBA{214, 39, 40, 255}, color.RGBA{148, 103, 189, 255}
	initial := 0.0
	if sum.Before != nil {
		initial = sum.Before.Success
	}
	for _, err := range []error{
		add("training reward (mean)", reward, grey, 1, false, false),
		add("training episodes calling the tool", tool, purple, 1, true, false),
		add("held-out success (greedy)", success, blue, 2.5, false, true),
		add("held-out calls of the right key", evKey, green, 1.5, false, true),
		add("initial policy's held-out success", ref(initial), orange, 1.5, true, false),
		add("best constant answer (no tool)", ref(sum.Constant), red, 1.5, true, false),
	} {
		if err != nil {
			return err
		}
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.X.Min, p.X.Max = 0, xEnd
	img := vgimg.New(9*vg.Inch, 5*vg.Inch)
	p.Draw(draw.New(img))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
