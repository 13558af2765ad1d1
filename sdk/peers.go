package sdk

// Peer weight distribution: which server fetches a new version from where. The tree is built
// here, by a pure function, and sent in the signed stage command; each server relays what it
// receives to its children while it fetches, so the origin (the trainer's weight server) sends
// about one checkpoint per update however large the fleet.

// Defaults of the distribution tree (Plan.PeerFanOut, Plan.OriginFanOut).
const (
	// DefaultPeerFanOut is how many servers one server feeds at most: two children share a
	// server's uplink, so a relayed stream runs at half a link and the whole fleet stages in
	// about twice one server's fetch plus a term per tree level (log2 N levels).
	DefaultPeerFanOut = 2
	// DefaultOriginFanOut is how many servers fetch from the origin: one, so the trainer's
	// egress is one checkpoint per update.
	DefaultOriginFanOut = 1
)

// Origin is the source AssignSources names for a server that fetches from the origin.
const Origin = ""

// AssignSources builds the distribution tree of one update. need lists the servers that must
// fetch the version, in the order they are placed (breadth first); relay says which of them can
// serve peers (a server without a peer route is only ever a leaf); holders are fleet members
// that already hold the version and feed up to fanOut servers each before the origin feeds
// originFanOut. The answer maps every server of need to its source: a holder, an earlier
// server of need, or Origin. Sources are only holders, relaying members of need or the origin,
// no source has more children than its fan-out, the tree has no cycle (a source is always
// placed before its children) and its depth is about log_fanOut(len(need)). fanOut < 1 means
// no peers: everyone fetches from the origin. When the origin and every holder and relay are
// full (originFanOut < 1 with nobody to relay), the rest fetch from the origin.
func AssignSources(need []string, relay func(id string) bool, holders []string, fanOut, originFanOut int) map[string]string {
	out := make(map[string]string, len(need))
	if fanOut < 1 {
		for _, id := range need {
			out[id] = Origin
		}
		return out
	}
	type slot struct {
		id   string
		left int
	}
	queue := make([]slot, 0, len(need)+len(holders)+1)
	seen := make(map[string]bool, len(need)+len(holders))
	for _, h := range holders {
		if h != Origin && !seen[h] {
			seen[h] = true
			queue = append(queue, slot{h, fanOut})
		}
	}
	queue = append(queue, slot{Origin, max(originFanOut, 0)})
	head := 0
	for _, id := range need {
		if seen[id] {
			continue // a holder, or listed twice
		}
		seen[id] = true
		for head < len(queue) && queue[head].left == 0 {
			head++
		}
		src := Origin
		if head < len(queue) {
			src = queue[head].id
			queue[head].left--
		}
		out[id] = src
		if relay == nil || relay(id) {
			queue = append(queue, slot{id, fanOut})
		}
	}
	return out
}
