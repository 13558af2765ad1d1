package sdk

import (
	"encoding/binary"
	"hash/fnv"
	"strings"
)

// affinityTokens is how much of a prompt decides its server: one KV block at the servers'
// default block size, so prompts that share a first block share a prefix-cache entry.
const affinityTokens = 16

// candidate is a routable server with its load (running + waiting sequences as the server
// last reported, plus what this client has sent it since).
type candidate struct {
	id   string
	url  string
	load int
	// floor is the lowest weight version the request may run on: the caller's MinVersion
	// or the fleet's desired version, whichever is higher.
	floor int64
}

// affinityKey hashes the cache salt and the first block of a prompt.
func affinityKey(prompt []int, salt string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(salt))
	var b [8]byte
	for _, t := range prompt[:min(len(prompt), affinityTokens)] {
		binary.LittleEndian.PutUint64(b[:], uint64(t))
		_, _ = h.Write(b[:])
	}
	return h.Sum64()
}

// routingKey is a request's affinity: its AffinityKey when set, else its prompt's first block
// (both under its cache salt).
func routingKey(req GenerateRequest) uint64 {
	if req.AffinityKey != "" {
		h := fnv.New64a()
		_, _ = h.Write([]byte(req.CacheSalt))
		_, _ = h.Write([]byte{0xff}) // keeps a key from colliding with a salt + prompt hash
		_, _ = h.Write([]byte(req.AffinityKey))
		return h.Sum64()
	}
	return affinityKey(req.PromptTokenIDs, req.CacheSalt)
}

// rendezvous scores server id for key; the highest score is the key's home server, and
// removing a server moves only the keys that lived on it.
func rendezvous(key uint64, id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	x := h.Sum64() ^ key
	// splitmix64 finalizer: FNV's low bits mix poorly for short inputs.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// choose picks the server for a request of n sequences: the pinned server when it is a
// candidate within the load bound, else the key's highest-ranked server whose load is within
// slack of the least loaded one (bounded-load rendezvous hashing). It keeps a prompt group
// on its home server while the fleet is balanced and spills over when that server runs
// ahead. It returns -1 for no candidates.
func choose(cands []candidate, key uint64, pin string, n int) int {
	if len(cands) == 0 {
		return -1
	}
	minLoad := cands[0].load
	for _, c := range cands[1:] {
		minLoad = min(minLoad, c.load)
	}
	slack := 8 + n
	if pin != "" {
		for i, c := range cands {
			if c.id == pin && c.load <= minLoad+slack {
				return i
			}
		}
	}
	best, bestScore := -1, uint64(0)
	for i, c := range cands {
		if c.load > minLoad+slack {
			continue
		}
		s := rendezvous(key, c.id)
		if best < 0 || s > bestScore || s == bestScore && strings.Compare(c.id, cands[best].id) < 0 {
			best, bestScore = i, s
		}
	}
	return best
}
