package core

import (
	"fmt"
	"go/constant"
	"go/token"
	"go/types"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The pad layout constants of include/symmem_device.cuh are those of Note
// [Pad partition].
func TestDeviceHeaderConstants(t *testing.T) {
	src, err := os.ReadFile("../include/symmem_device.cuh")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{
		"SYMMEM_DEV_HEADER_WORDS": DeviceRegionHeaderWords, "SYMMEM_DEV_SETS": DeviceSets,
		"SYMMEM_DEV_LIBRARY_SETS": LibrarySets, "SYMMEM_DEV_COLL_CHANNELS": CollChannels,
		"SYMMEM_DEV_COLL_MAX_BLOCKS": CollMaxBlocks, "SYMMEM_DEV_CAUSE_TIMEOUT": DevCauseTimeout,
		"SYMMEM_DEV_CAUSE_MISMATCH": DevCauseMismatch, "SYMMEM_DEV_CAUSE_PEER_EXITED": DevCausePeerExited,
		"SYMMEM_DEV_CAUSE_GAVE_UP": DevCauseGaveUp, "SYMMEM_DEV_STOP_WORD": DevStopWord,
	} {
		m := regexp.MustCompile(`#define ` + name + ` (\d+)`).FindSubmatch(src)
		if m == nil {
			t.Errorf("%s is not defined in symmem_device.cuh", name)
			continue
		}
		if got, _ := strconv.Atoi(string(m[1])); got != want {
			t.Errorf("%s = %d in the header, %d in Go", name, got, want)
		}
	}
}

// SYMMEM_DEV_REGION_BYTES(world) of the header, evaluated as Go constant
// arithmetic, is DeviceRegionBytes(world).
func TestDeviceHeaderRegionBytes(t *testing.T) {
	src, err := os.ReadFile("../include/symmem_device.cuh")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?s)#define SYMMEM_DEV_REGION_BYTES\(world\)(.*?[^\\])\n`).FindSubmatch(src)
	require.NotNil(t, m, "SYMMEM_DEV_REGION_BYTES(world) is not defined")
	body := strings.NewReplacer("\\\n", " ", "ull", "", "SYMMEM_DEV_HEADER_WORDS", fmt.Sprint(DeviceRegionHeaderWords),
		"SYMMEM_DEV_SETS", fmt.Sprint(DeviceSets), "SYMMEM_DEV_LIBRARY_SETS", fmt.Sprint(LibrarySets)).Replace(string(m[1]))
	for _, world := range []int{1, 2, 3, 8} {
		tv, err := types.Eval(token.NewFileSet(), nil, token.NoPos, strings.ReplaceAll(body, "(world)", fmt.Sprint(world)))
		require.NoError(t, err, body)
		got, _ := constant.Uint64Val(tv.Value)
		require.Equal(t, uint64(DeviceRegionBytes(world)), got, "world %d: %s", world, body)
	}
}
