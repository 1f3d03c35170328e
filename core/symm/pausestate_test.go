package symm

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/internal/faultbe"
	"github.com/stretchr/testify/require"
)

// A collective pause whose unmap of a peer's segment fails on one rank
// leaves that import mapped and not marked paused (it was marked paused, its
// memory released under the live mapping); the resume then drops it and maps
// the peer's new memory there, so the ranks agree again.
func TestCollectivePauseUnmapFailureLeavesTheImportMapped(t *testing.T) {
	tag := fmt.Sprintf("unmapfail-%d", time.Now().UnixNano()%1e9)
	errs := onTwoFaultRanks(t, "pause-unmap-fails", 20*time.Second, nil, func(e *rankEnv, fb *faultbe.Backend, a *alloc.Allocator) error {
		g, h, err := joinTagged(e, a, tag)
		if err != nil {
			return err
		}
		defer g.Destroy()
		defer h.Release()
		s, dropStream, err := rankStream(fb, e.device)
		if err != nil {
			return err
		}
		defer dropStream()
		if err := exchangeWords(h, fb, s, 1); err != nil {
			return err
		}
		if e.rank == 1 {
			fb.FailNth("Unmap", 1) // the release phase's first: our import of rank 0's segment
		}
		err = g.Pause(tag)
		fb.Clear()
		if core.CodeOf(err) != core.ErrBackend {
			return fmt.Errorf("pause with a failing unmap on rank 1: %v, want BACKEND", err)
		}
		if e.rank == 1 {
			if len(h.maps) != 1 || h.maps[0].paused || h.maps[0].mem == 0 {
				return fmt.Errorf("the import whose unmap failed: %+v, want mapped and not paused", h.maps)
			}
		}
		if err := g.Resume(tag); err != nil {
			return fmt.Errorf("resume: %v", err)
		}
		return exchangeWords(h, fb, s, 2)
	})
	require.NoError(t, errs[0], "rank 0")
	require.NoError(t, errs[1], "rank 1")
}

// pidfds counts this process's open pidfds.
func pidfds(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == "anon_inode:[pidfd]" {
			n++
		}
	}
	return n
}

// Note [Who closes the pidfds]: the group's pidfds are closed with its last
// reference even when the device synchronisation before the memory goes
// fails (the memory is leaked then; the pidfds were too).
func TestFailedSyncClosesPidfds(t *testing.T) {
	before := pidfds(t)
	errs := onTwoFaultHosts(t, "pidfds-on-failed-sync", func(h *Handle, g *Group, fb *faultbe.Backend) error {
		if err := g.Destroy(); err != nil {
			return err
		}
		fb.Add(faultbe.Rule{Method: "SynchronizeDevice"}) // every call fails
		err := h.Release()
		fb.Clear()
		if err == nil {
			return fmt.Errorf("release with a failing synchronisation succeeded")
		}
		return nil
	})
	require.NoError(t, errs[0], "rank 0")
	require.NoError(t, errs[1], "rank 1")
	require.Equal(t, before, pidfds(t), "pidfds open after the groups went")
}
