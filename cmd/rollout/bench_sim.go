package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/bench"
	"github.com/rolloutkit/rollout/sdk"
)

// simFlags are the --simulate model's parameters (bench.NetModel).
type simFlags struct {
	sizes                   []int
	checkpointGB            float64
	linkGbps, originGbps    float64
	latency, stageCost      time.Duration
	chunkMiB                int
	fanOut, originFanOut    int
	updateEvery             time.Duration
	replaySecs, controlRTTs int
}

func (s *simFlags) register(cmd *cobra.Command) {
	d := bench.DefaultNetModel()
	f := cmd.Flags()
	f.IntSliceVar(&s.sizes, "simulate", nil, "simulate fleets of these sizes (e.g. 10,100,1000): real agent cores and SDK on the in-process bus, a simulated engine and network; only this figure is measured")
	f.Float64Var(&s.checkpointGB, "sim-checkpoint-gb", float64(d.CheckpointBytes)/1e9, "simulated checkpoint size, GB")
	f.Float64Var(&s.linkGbps, "sim-link-gbps", d.LinkBytesPerSec*8/1e9, "simulated link of every server, Gbit/s each way")
	f.Float64Var(&s.originGbps, "sim-origin-gbps", d.OriginBytesPerSec*8/1e9, "simulated egress link of the origin (the trainer's weight server), Gbit/s")
	f.DurationVar(&s.latency, "sim-latency", d.Latency, "simulated latency of one hop")
	f.IntVar(&s.chunkMiB, "sim-chunk-mib", int(d.ChunkBytes>>20), "simulated relay chunk, MiB")
	f.DurationVar(&s.stageCost, "sim-stage-cost", d.StageCost, "simulated engine time to load a fetched checkpoint")
	f.IntVar(&s.fanOut, "fan-out", sdk.DefaultPeerFanOut, "servers one server feeds (negative: no peers)")
	f.IntVar(&s.originFanOut, "origin-fan-out", sdk.DefaultOriginFanOut, "servers the origin feeds")
	f.DurationVar(&s.updateEvery, "update-every", 10*time.Second, "one UpdateWeights this often, for the control plane's load")
	f.IntVar(&s.replaySecs, "replay-seconds", 10, "seconds of control traffic replayed against redis-server to measure its CPU")
	f.IntVar(&s.controlRTTs, "sim-rounds", 20, "control round trips timed per fleet size")
}

func (s *simFlags) model() bench.NetModel {
	m := bench.DefaultNetModel()
	m.CheckpointBytes = int64(s.checkpointGB * 1e9)
	m.LinkBytesPerSec, m.OriginBytesPerSec = s.linkGbps*1e9/8, s.originGbps*1e9/8
	m.Latency, m.ChunkBytes, m.StageCost = s.latency, int64(s.chunkMiB)<<20, s.stageCost
	return m
}

func runSimulate(ctx context.Context, out io.Writer, log *slog.Logger, s *simFlags, redisURL string, asJSON bool) error {
	rep := bench.SimReport{Model: s.model(), FanOut: s.fanOut, OriginFanOut: s.originFanOut, UpdateEvery: s.updateEvery}
	var rs *bench.RedisServer
	if redisURL == "" {
		var err error
		if rs, err = bench.StartRedis(ctx); err != nil {
			rep.RedisNote = "no redis-server: load not replayed (" + err.Error() + ")"
		} else {
			defer rs.Stop()
			rep.RedisNote = "load replayed against a redis-server started by the benchmark"
			if rep.RedisGETPerSec, err = bench.RedisBenchmarkGET(ctx, rs.URL); err != nil {
				rep.RedisNote += "; " + err.Error()
			}
		}
	} else {
		rep.RedisNote = "--redis given: the load is replayed only against a redis-server the benchmark starts (its CPU time is read from /proc)"
	}
	for _, n := range s.sizes {
		log.Info("bench fleet: simulate", "servers", n)
		r, err := bench.Simulate(ctx, bench.SimConfig{Net: rep.Model, FanOut: s.fanOut, OriginFanOut: s.originFanOut, Rounds: s.controlRTTs}, n)
		if err != nil {
			return fmt.Errorf("simulate %d servers: %w", n, err)
		}
		rep.Rows = append(rep.Rows, r)
		l := bench.Load(n, r.UpdateOps, s.updateEvery)
		if rep.RedisGETPerSec > 0 {
			l.CapacityShare = l.KeyOpsPerSec / rep.RedisGETPerSec
		}
		if rs != nil {
			if l.RedisCPU, err = bench.ReplayLoad(ctx, rs.URL, rs.PID(), l, r.UpdateOps, s.updateEvery, s.replaySecs); err != nil {
				return fmt.Errorf("replay the load of %d servers: %w", n, err)
			}
		}
		rep.Load = append(rep.Load, l)
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printSim(out, &rep)
}

func printSim(out io.Writer, rep *bench.SimReport) error {
	m := rep.Model
	fmt.Fprintf(out, "simulated fleet: checkpoint %.1f GB, links %.1f Gbit/s, origin %.1f Gbit/s, hop %s, chunk %d MiB, stage cost %s, cut %s; fan-out %d, origin fan-out %d\n\n",
		float64(m.CheckpointBytes)/1e9, m.LinkBytesPerSec*8/1e9, m.OriginBytesPerSec*8/1e9, m.Latency, m.ChunkBytes>>20, m.StageCost, m.Engine.Total(), rep.FanOut, rep.OriginFanOut)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "servers\tcontrol rtt p50 ms\tegress (checkpoints/update, goal <= 2)\tstage single s\tstage fleet s\tgoal s (2x single + levels x hop)\tlevels\tbubble ms\toutcome")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%.0f\t%s\n", r.Servers, r.ControlRTT.P50Ms, r.EgressCheckpoints, r.StageSingle.Seconds(),
			r.StageFleet.Seconds(), r.StageBound.Seconds(), r.Depth, float64(r.Bubble)/float64(time.Millisecond), r.Outcome)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\ncontrol plane load, one update every %s; %s; redis-benchmark GET %.0f/s\n", rep.UpdateEvery, rep.RedisNote, rep.RedisGETPerSec)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "servers\theartbeats/s\tdesired reads/s\tacks/s\theartbeat reads/s (sdk)\tkey ops/s\tshare of GET capacity\tredis-server CPU (goal <= 5% of a core)")
	for _, l := range rep.Load {
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.1f\t%.0f\t%.0f\t%.2f%%\t%.2f%%\n", l.Servers, l.HeartbeatsPerSec, l.DesiredReadsPS, l.AcksPerSec,
			l.HeartbeatReadsPS, l.KeyOpsPerSec, 100*l.CapacityShare, 100*l.RedisCPU)
	}
	return tw.Flush()
}
