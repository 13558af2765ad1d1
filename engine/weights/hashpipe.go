package weights

import (
	"hash"
	"io"
	"unsafe"
)

// hashPipe feeds a hash on its own goroutine, so that hashing a checkpoint (SHA-256 runs at
// about 1.4 GB/s on one core, slower than reading from the page cache) overlaps reading and
// decoding it instead of adding to them: on 2 cores a load takes about as long as the hash
// alone. Chunks are hashed in the order given and must not change until hashed; a chunk sent
// with a recycle channel goes back on it once hashed, so the reader can reuse the buffer.
type hashPipe struct {
	ch   chan hashChunk
	done chan struct{}
}

type hashChunk struct {
	b       []byte
	recycle chan<- []byte
}

// hashPipeDepth bounds the chunks queued ahead of the hasher; views of decoded tensors cost no
// memory, so this only bounds how far the reader runs ahead.
const hashPipeDepth = 64

func newHashPipe(h hash.Hash) *hashPipe {
	p := &hashPipe{ch: make(chan hashChunk, hashPipeDepth), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for c := range p.ch {
			h.Write(c.b)
			if c.recycle != nil {
				c.recycle <- c.b
			}
		}
	}()
	return p
}

// write queues b for hashing.
func (p *hashPipe) write(b []byte, recycle chan<- []byte) { p.ch <- hashChunk{b: b, recycle: recycle} }

// readFull fills b from r and queues it for hashing (see write for recycle).
func (p *hashPipe) readFull(r io.Reader, b []byte, recycle chan<- []byte) error {
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	p.write(b, recycle)
	return nil
}

// sync returns once every chunk queued so far is hashed, so their memory may be reused.
func (p *hashPipe) sync() {
	done := make(chan []byte, 1)
	p.write(nil, done) // chunks are hashed in order: this one comes back after all before it
	<-done
}

// wait hashes what is queued and stops the goroutine; after it the hash holds every chunk.
func (p *hashPipe) wait() {
	close(p.ch)
	<-p.done
}

// pipeReader reads r and hashes what it reads through a hashPipe. Read copies each chunk for
// the hasher (the caller may reuse its buffer); readInto hands over the caller's own bytes,
// which must then stay unchanged, so bulk tensor data is read once and never copied.
type pipeReader struct {
	r  io.Reader
	hp *hashPipe
}

func (p *pipeReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.hp.write(append([]byte(nil), b[:n]...), nil)
	}
	return n, err
}

// readInto fills b from r and queues b itself for hashing.
func (p *pipeReader) readInto(b []byte) error { return p.hp.readFull(p.r, b, nil) }

// nativeLittleEndian reports whether float32 in memory is laid out as in a safetensors file,
// so that F32 data can be read straight into the tensor.
func nativeLittleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// float32Bytes is the memory of v as bytes.
func float32Bytes(v []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}
