// Package weightstore keeps versioned model checkpoints in a directory and serves them over
// HTTP so that rollout servers can fetch and verify each new version.
//
// Version N lives in DIR/vN/ as a Hugging Face checkpoint in the engine's layout (config.json
// and model.safetensors, or an index and shards). Its digest is the engine's own
// (weights.Digest), so a weights.Ref built from an Entry passes the SHA-256 check of
// /update_weights. The HTTP handler serves each version's files under /vN/ and an index of all
// versions with their digests at / and /index.json; weights.Load with the URI
// http://host/vN/ fetches exactly those files.
package weightstore
