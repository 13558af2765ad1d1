package redistest

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Cluster is a Redis Cluster of primaries (no replicas) owned by one test.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n cluster-enabled servers, joins them with `redis-cli --cluster
// create` (all slots spread over them) and returns once every node reports cluster_state:ok.
// Without redis-cli on PATH the test is skipped.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli is not installed; a cluster test needs it to create the cluster")
	}
	c := &Cluster{}
	for range n {
		// The cluster bus listens on a port of its own, probed free like the data port.
		c.Nodes = append(c.Nodes, StartWith(t, Options{extra: func(int) []string {
			bus, err := freePort()
			if err != nil {
				t.Fatalf("redistest: free port: %v", err)
			}
			return []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "5000", "--cluster-port", strconv.Itoa(bus)}
		}}))
	}
	args := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	waitFor(t, "the cluster to be ok on every node", 3*startTimeout, func() bool {
		for _, s := range c.Nodes {
			if !strings.Contains(clusterInfo(s.Addr()), "cluster_state:ok") {
				return false
			}
		}
		return true
	})
	return c
}

// URL is the redis+cluster:// URL listing every node.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

func clusterInfo(addr string) string { return infoCmd(addr, "", "CLUSTER INFO") }
