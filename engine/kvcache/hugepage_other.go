//go:build !linux

package kvcache

// adviseHugePages does nothing off Linux (see the Linux build).
func adviseHugePages([]float32) {}
