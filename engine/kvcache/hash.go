package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// BlockHash identifies the content of one full block together with everything before it: it is
// chained, so equal hashes mean equal token prefixes (and equal weight version and cache salt).
type BlockHash [32]byte

// String returns the first 8 bytes in hex, enough to tell hashes apart in logs.
func (h BlockHash) String() string { return hex.EncodeToString(h[:8]) }

// noneHash is the parent of a request's first block. vLLM draws it at random per process; a fixed
// value keeps hashes stable across processes and runs, which the determinism rule needs.
var noneHash = BlockHash(sha256.Sum256([]byte("rollout/kvcache: root block hash v1")))

// Domain tags keep the first-block extra keys from colliding with a token encoding.
const (
	tagFirst byte = 1
	tagChild byte = 2
)

// HashBlock hashes one full block: SHA-256 over the parent hash, the block's token ids and the extra
// keys. first marks a request's first block, whose hash also covers weightVersion and cacheSalt;
// children inherit both through the chain, so KV computed under one weight version (or for one salt)
// can never match a lookup under another.
func HashBlock(parent BlockHash, first bool, tokens []int, weightVersion int64, cacheSalt string) BlockHash {
	h := sha256.New()
	var buf [8]byte
	if first {
		h.Write([]byte{tagFirst})
		h.Write(noneHash[:])
		binary.LittleEndian.PutUint64(buf[:], uint64(weightVersion))
		h.Write(buf[:])
		binary.LittleEndian.PutUint64(buf[:], uint64(len(cacheSalt)))
		h.Write(buf[:])
		h.Write([]byte(cacheSalt))
	} else {
		h.Write([]byte{tagChild})
		h.Write(parent[:])
	}
	binary.LittleEndian.PutUint64(buf[:], uint64(len(tokens)))
	h.Write(buf[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint64(buf[:], uint64(int64(t)))
		h.Write(buf[:])
	}
	var out BlockHash
	h.Sum(out[:0])
	return out
}

// ExtendHashes appends to hashes the hashes of every full block of tokens not yet hashed and returns
// the extended slice. Only full blocks are hashed; call it again as tokens are appended (decode).
func ExtendHashes(hashes []BlockHash, tokens []int, blockSize int, weightVersion int64, cacheSalt string) []BlockHash {
	if blockSize <= 0 {
		return hashes
	}
	for i := len(hashes); (i+1)*blockSize <= len(tokens); i++ {
		var parent BlockHash
		if i > 0 {
			parent = hashes[i-1]
		}
		hashes = append(hashes, HashBlock(parent, i == 0, tokens[i*blockSize:(i+1)*blockSize], weightVersion, cacheSalt))
	}
	return hashes
}
