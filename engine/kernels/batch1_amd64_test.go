//go:build amd64 && !purego

package kernels

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCPUVendorFamilyMatchesProc: CPUID's vendor and family are the kernel's (/proc/cpuinfo's
// vendor_id and cpu family), where Linux shows them.
func TestCPUVendorFamilyMatchesProc(t *testing.T) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		t.Skip("no /proc/cpuinfo:", err)
	}
	defer f.Close()
	var vendor, family string
	sc := bufio.NewScanner(f)
	for sc.Scan() && (vendor == "" || family == "") {
		k, v, ok := strings.Cut(sc.Text(), ":")
		switch k, v = strings.TrimSpace(k), strings.TrimSpace(v); {
		case !ok:
		case k == "vendor_id":
			vendor = v
		case k == "cpu family":
			family = v
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, family, "/proc/cpuinfo has no cpu family")
	want, err := strconv.ParseUint(family, 10, 32)
	require.NoError(t, err)
	amd, got := cpuVendorFamily()
	assert.Equal(t, vendor == "AuthenticAMD", amd, "vendor %q", vendor)
	assert.Equal(t, uint32(want), got)
	t.Logf("vendor %s, family %#x: batch-1 tiles prefetch: %v", vendor, got, batch1Prefetches(amd, got))
}

// TestBatch1PrefetchesWhereMeasured: the batch-1 tiles prefetch on Intel and on Zen 5,
// not on Zen 4, where it was measured to cost.
func TestBatch1PrefetchesWhereMeasured(t *testing.T) {
	assert.True(t, batch1Prefetches(false, 6), "Intel Xeon")
	assert.False(t, batch1Prefetches(true, 0x19), "Zen 4")
	assert.True(t, batch1Prefetches(true, 0x1a), "Zen 5")
}
