package weights

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/rolloutkit/rollout/engine/model"
)

// File names of a Hugging Face checkpoint directory.
const (
	ConfigFile      = "config.json"
	SafetensorsFile = "model.safetensors"
	IndexFile       = "model.safetensors.index.json"
)

// maxShards bounds the number of shard files an index may name.
const maxShards = 4096

// fileOpener opens files for reading: the OS (no restriction) or an *os.Root.
type fileOpener interface {
	Open(name string) (*os.File, error)
}

type osOpener struct{}

func (osOpener) Open(name string) (*os.File, error) { return os.Open(name) }

// readSmall reads a whole file of at most limit bytes.
func readSmall(op fileOpener, name string, limit int64) ([]byte, error) {
	f, err := op.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > limit {
		return nil, badf(name, "%d bytes exceeds the %d byte limit", st.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, badf(name, "exceeds the %d byte limit", limit)
	}
	return b, nil
}

// fileSum is one line of a checkpoint's digest listing.
type fileSum struct {
	name string // base name within the checkpoint directory
	sum  []byte
}

// listingDigest is the digest of a multi-file checkpoint: the SHA-256 of the sha256sum-style
// listing "<hex>  <name>\n" of its files in order (see Digest).
func listingDigest(files []fileSum) string {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%x  %s\n", f.sum, f.name)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// parseIndex returns the weight map of model.safetensors.index.json and its shard file
// names, sorted. Shard names must be plain file names in the same directory.
func parseIndex(data []byte) (map[string]string, []string, error) {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, nil, badf(IndexFile, "%v", err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, nil, badf(IndexFile, "empty or missing weight_map")
	}
	seen := map[string]bool{}
	var shards []string
	for tensor, shard := range idx.WeightMap {
		if !seen[shard] {
			if !filepath.IsLocal(shard) || strings.ContainsAny(shard, `/\`) ||
				!strings.HasSuffix(shard, ".safetensors") {
				return nil, nil, badf(IndexFile, "tensor %q: shard %q is not a .safetensors file in the checkpoint directory", tensor, shard)
			}
			seen[shard] = true
			shards = append(shards, shard)
			if len(shards) > maxShards {
				return nil, nil, badf(IndexFile, "more than %d shards", maxShards)
			}
		}
	}
	sort.Strings(shards)
	return idx.WeightMap, shards, nil
}

// LoadHF loads a Hugging Face checkpoint directory: config.json plus model.safetensors or,
// when that is absent, model.safetensors.index.json and its shards.
func LoadHF(dir string) (*model.Weights, error) {
	w, _, err := loadHF(context.Background(), osOpener{}, dir, nil, nil)
	return w, err
}

// ReadHFConfig reads the model configuration of a Hugging Face checkpoint directory (its
// config.json), e.g. to start a model.Builder before loading the tensors into it (LoadHFInto).
func ReadHFConfig(dir string) (model.Config, error) {
	b, err := readSmall(osOpener{}, filepath.Join(dir, ConfigFile), maxJSONBytes)
	if err != nil {
		return model.Config{}, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}
	c, err := parseHFConfig(b)
	if err != nil {
		return model.Config{}, fmt.Errorf("%w: %s: %w", ErrBadCheckpoint, filepath.Join(dir, ConfigFile), err)
	}
	return c, nil
}

// LoadHFInto loads a Hugging Face checkpoint directory into sink one tensor at a time (see
// Options.Sink): no float32 set of it exists.
func LoadHFInto(dir string, sink Sink) error {
	if sink == nil {
		return fmt.Errorf("%w: nil sink", ErrInvalidRef)
	}
	_, _, err := loadHF(context.Background(), osOpener{}, dir, nil, sink)
	return err
}

// openShard is a shard file with its validated header, positioned at its data section.
type openShard struct {
	name string
	f    *os.File
	r    io.Reader // the file, buffered; the header is hashed by a tee, the data by readSTData
	sum  hash.Hash
	hdr  *stHeader
}

// loadHF loads dir through op, decoding into reuse's tensors where they fit (see
// Options.Reuse), and returns the weights and the checkpoint digest (see Digest), computed
// over exactly the bytes that were parsed.
func loadHF(ctx context.Context, op fileOpener, dir string, reuse *model.Weights, sink Sink) (*model.Weights, Info, error) {
	cfgBytes, err := readSmall(op, filepath.Join(dir, ConfigFile), maxJSONBytes)
	if err != nil {
		return nil, Info{}, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}
	cfg, err := parseHFConfig(cfgBytes)
	if err != nil {
		return nil, Info{}, fmt.Errorf("%w: %s: %w", ErrBadCheckpoint, filepath.Join(dir, ConfigFile), err)
	}
	total := int64(len(cfgBytes))
	cfgSum := sha256.Sum256(cfgBytes)
	sums := []fileSum{{ConfigFile, cfgSum[:]}}

	var weightMap map[string]string // nil for a single file
	shardNames := []string{SafetensorsFile}
	single, err := op.Open(filepath.Join(dir, SafetensorsFile))
	switch {
	case err == nil:
		single.Close() // reopened below with the shards, keeping one code path
	case errors.Is(err, fs.ErrNotExist):
		idxBytes, ierr := readSmall(op, filepath.Join(dir, IndexFile), maxJSONBytes)
		if ierr != nil {
			if errors.Is(ierr, fs.ErrNotExist) {
				return nil, Info{}, fmt.Errorf("%w: %s: neither %s nor %s", ErrBadCheckpoint, dir, SafetensorsFile, IndexFile)
			}
			return nil, Info{}, fmt.Errorf("%w: %w", ErrBadCheckpoint, ierr)
		}
		if weightMap, shardNames, err = parseIndex(idxBytes); err != nil {
			return nil, Info{}, err
		}
		total += int64(len(idxBytes))
		idxSum := sha256.Sum256(idxBytes)
		sums = append(sums, fileSum{IndexFile, idxSum[:]})
	default:
		return nil, Info{}, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}

	// Open every shard and validate every header before allocating any tensor.
	shards := make([]*openShard, len(shardNames))
	byName := map[string]*openShard{}
	defer func() {
		for _, s := range shards {
			if s != nil {
				s.f.Close()
			}
		}
	}()
	for i, name := range shardNames {
		path := filepath.Join(dir, name)
		f, err := op.Open(path)
		if err != nil {
			return nil, Info{}, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
		}
		s := &openShard{name: name, f: f, sum: sha256.New()}
		shards[i] = s
		st, err := f.Stat()
		if err != nil {
			return nil, Info{}, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
		}
		if !st.Mode().IsRegular() {
			return nil, Info{}, badf(path, "not a regular file")
		}
		total += st.Size()
		s.r = bufio.NewReaderSize(f, readBufBytes)
		if s.hdr, err = readSTHeader(io.TeeReader(s.r, s.sum), st.Size(), path); err != nil {
			return nil, Info{}, err
		}
		byName[name] = s
	}

	w := &model.Weights{Config: cfg}
	if sink != nil {
		if err := sink.SetConfig(cfg); err != nil {
			return nil, Info{}, fmt.Errorf("%w: %s: %w", ErrBadCheckpoint, dir, err)
		}
	}
	dst := make(map[*openShard]map[string]*[]float32, len(shards))
	add := func(name string, shape []int, p *[]float32) error {
		s := shards[0]
		if weightMap != nil {
			sn, ok := weightMap[name]
			if !ok {
				return badf(filepath.Join(dir, IndexFile), "missing tensor %q", name)
			}
			s = byName[sn]
		}
		i, ok := s.hdr.byName[name]
		if !ok {
			return badf(s.hdr.file, "missing tensor %q", name)
		}
		if got := s.hdr.tensors[i].shape; !slices.Equal(got, shape) {
			return badf(s.hdr.file, "tensor %q has shape %v, config implies %v", name, got, shape)
		}
		if dst[s] == nil {
			dst[s] = map[string]*[]float32{}
		}
		dst[s][name] = p
		return nil
	}
	for _, t := range w.Tensors() {
		if err := add(t.Name, t.Shape, t.Data); err != nil {
			return nil, Info{}, err
		}
	}
	// Only now that the files hold every tensor at the config's shape: a config.json claiming
	// a larger model than its files must fail above, not allocate that model first.
	if sink == nil {
		fill(w, reuseTensors(reuse))
	}
	// A tied checkpoint may still carry lm_head.weight; accept it only if it is the embedding.
	var tiedHead []float32
	const lmHead = "lm_head.weight"
	if cfg.TieWordEmbeddings {
		present := false
		if weightMap != nil {
			_, present = weightMap[lmHead]
		} else {
			_, present = shards[0].hdr.byName[lmHead]
		}
		if present {
			if err := add(lmHead, []int{cfg.VocabSize, cfg.HiddenSize}, &tiedHead); err != nil {
				return nil, Info{}, err
			}
		}
	}

	for _, s := range shards {
		if err := readSTData(ctx, s.r, s.sum, s.hdr, dst[s], sink); err != nil {
			return nil, Info{}, err
		}
		sums = append(sums, fileSum{s.name, s.sum.Sum(nil)})
	}
	if sink != nil {
		return nil, Info{Format: FormatHF, Digest: listingDigest(sums), Bytes: total}, nil
	}
	if tiedHead != nil && !slices.Equal(tiedHead, w.Embed) {
		return nil, Info{}, badf(dir, "tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight")
	}
	if err := w.Check(); err != nil {
		return nil, Info{}, fmt.Errorf("%w: %s: %w", ErrBadCheckpoint, dir, err)
	}
	return w, Info{Format: FormatHF, Digest: listingDigest(sums), Bytes: total}, nil
}

// SaveHF writes w to dir as config.json and a single model.safetensors in dtype d. Files are
// written under temporary names and renamed, and a sharded index left in dir is removed, so
// that dir never holds a mix of two checkpoints' files.
func SaveHF(dir string, w *model.Weights, d DType) error {
	return saveHF(dir, w, d, 0)
}

// SaveHFSharded writes w to dir as config.json, model.safetensors.index.json and shards
// model-0000i-of-0000n.safetensors of at most maxShardBytes of tensor data each (a tensor
// larger than that gets a shard of its own, as transformers does). A single-file
// model.safetensors left in dir is removed, since loaders prefer it over an index.
func SaveHFSharded(dir string, w *model.Weights, d DType, maxShardBytes int64) error {
	if maxShardBytes <= 0 {
		return fmt.Errorf("%w: maxShardBytes %d must be positive", ErrUnsupportedFormat, maxShardBytes)
	}
	return saveHF(dir, w, d, maxShardBytes)
}

func saveHF(dir string, w *model.Weights, d DType, maxShard int64) error {
	if !d.valid() {
		return fmt.Errorf("%w: dtype %v", ErrUnsupportedFormat, d)
	}
	if err := w.Check(); err != nil {
		return fmt.Errorf("weights: save %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("weights: save: %w", err)
	}
	cfg, err := marshalHFConfig(w.Config, d)
	if err != nil {
		return fmt.Errorf("weights: save %s: %w", dir, err)
	}
	ts := w.Tensors()
	if maxShard == 0 {
		if err := writeFileAtomic(filepath.Join(dir, SafetensorsFile), func(f io.Writer) error {
			_, err := writeST(f, ts, d)
			return err
		}); err != nil {
			return err
		}
		if err := removeIfExists(filepath.Join(dir, IndexFile)); err != nil {
			return err
		}
		return writeFileAtomic(filepath.Join(dir, ConfigFile), bytesWriter(cfg))
	}

	var groups [][]model.Tensor
	var cur int64
	for _, t := range ts {
		n := int64(len(*t.Data)) * int64(d.Size())
		if len(groups) == 0 || (cur > 0 && cur+n > maxShard) {
			groups = append(groups, nil)
			cur = 0
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], t)
		cur += n
	}
	weightMap := map[string]string{}
	var total int64
	for i, g := range groups {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(groups))
		for _, t := range g {
			weightMap[t.Name] = name
			total += int64(len(*t.Data)) * int64(d.Size())
		}
		if err := writeFileAtomic(filepath.Join(dir, name), func(f io.Writer) error {
			_, err := writeST(f, g, d)
			return err
		}); err != nil {
			return err
		}
	}
	idx, err := json.MarshalIndent(map[string]any{
		"metadata":   map[string]any{"total_size": total},
		"weight_map": weightMap,
	}, "", "  ")
	if err != nil {
		return fmt.Errorf("weights: save %s: %w", dir, err)
	}
	if err := removeIfExists(filepath.Join(dir, SafetensorsFile)); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, IndexFile), bytesWriter(append(idx, '\n'))); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, ConfigFile), bytesWriter(cfg))
}

func bytesWriter(b []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := io.Copy(w, bytes.NewReader(b))
		return err
	}
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("weights: %w", err)
	}
	return nil
}

// writeFileAtomic writes path via a temporary file in the same directory and a rename, so a
// reader never sees a partial file.
func writeFileAtomic(path string, write func(io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = write(f); err != nil {
		return fmt.Errorf("weights: writing %s: %w", path, err)
	}
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("weights: writing %s: %w", path, err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	return nil
}
