package alloc_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
)

// Note [Host copies after a resume]: a releasing resume gives the copies
// back; a pinned one stays, empty, as the copy pinned ahead of the next
// pause (no pinning then), within SYMMEM_BACKUP_PIN_AHEAD.
func TestReleasingResumeKeepsThePinnedCopyAhead(t *testing.T) {
	be := newPinningBackend(t, 0)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	p, err := a.AllocTagged(1<<20, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 0x31, 1<<20)
	require.Eventually(t, func() bool { return be.allocs.Load() == 1 }, 5*time.Second, time.Millisecond)
	for round := byte(0); round < 3; round++ {
		poke(t, a, p, 0x31+round, 1)
		_, err = a.Pause(name, alloc.PauseOptions{})
		require.NoError(t, err)
		_, paused, err := a.BackupOf(p, 1)
		require.NoError(t, err)
		require.True(t, paused)
		_, err = a.ResumeWith(name, alloc.ResumeOptions{Backup: alloc.ResumeReleaseBackup})
		require.NoError(t, err)
		require.Equal(t, 0x31+round, peek(t, a, p, 1)[0])
		_, _, err = a.BackupOf(p, 1)
		require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "the copy was given back")
		require.EqualValues(t, 1, be.allocs.Load(), "pinned once, ahead")
		require.Equal(t, 1, be.liveCount(), "the pinned copy waits for the next pause")
		require.NoError(t, a.Validate())
	}
}

// Past the bound (here 0) a releasing resume frees the pinned copy: no
// host memory is held while the tag is live, and each pause pins.
func TestReleasingResumeFreesPastTheBound(t *testing.T) {
	t.Cleanup(func() { core.ReloadSettings() }) // after Setenv's own cleanup
	t.Setenv("SYMMEM_BACKUP_PIN_AHEAD", "0")
	core.ReloadSettings()
	be := newPinningBackend(t, 0)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	p, err := a.AllocTagged(1<<20, 0, id)
	require.NoError(t, err)
	for round := byte(1); round <= 2; round++ {
		poke(t, a, p, round, 1<<20)
		_, err = a.Pause(name, alloc.PauseOptions{})
		require.NoError(t, err)
		require.Equal(t, 1, be.liveCount())
		_, err = a.ResumeWith(name, alloc.ResumeOptions{Backup: alloc.ResumeReleaseBackup})
		require.NoError(t, err)
		require.Equal(t, round, peek(t, a, p+(1<<20)-1, 1)[0])
		require.Zero(t, be.liveCount(), "the pinned copy went back at the resume")
		require.EqualValues(t, round, be.frees.Load())
	}
	require.NoError(t, a.Validate())
}

// Pageable and disk copies are freed by a releasing resume; a tag's
// contents still survive the next cycle (a new copy is made).
func TestReleasingResumeFreesPageableAndDiskCopies(t *testing.T) {
	for _, kind := range []alloc.BackupKind{alloc.BackupPageable, alloc.BackupDisk} {
		t.Run(kind.String(), func(t *testing.T) {
			if kind == alloc.BackupDisk {
				require.NoError(t, alloc.SetBackupDir(t.TempDir()))
				t.Cleanup(func() { _ = alloc.SetBackupDir("") })
			}
			be := newPinningBackend(t, 0)
			a := newAllocator(t, be)
			name, id := kindTag(t, "w", kind)
			p, err := a.AllocTagged(1<<20, 0, id)
			require.NoError(t, err)
			for round := byte(1); round <= 2; round++ {
				poke(t, a, p, round, 1<<20)
				_, err = a.Pause(name, alloc.PauseOptions{})
				require.NoError(t, err)
				_, err = a.ResumeWith(name, alloc.ResumeOptions{Backup: alloc.ResumeReleaseBackup})
				require.NoError(t, err)
				require.Equal(t, round, peek(t, a, p+12345, 1)[0])
				_, _, err = a.BackupOf(p, 1)
				require.Equal(t, core.ErrInvalidState, core.CodeOf(err))
			}
			require.Zero(t, be.allocs.Load())
			require.NoError(t, a.Validate())
		})
	}
}

// A retained copy keeps its address after the resume and at the next
// pause, even where the first pause made a pageable stand-in and the
// pinned copy arrived since; a releasing resume frees the stand-in, and
// the pause after it uses the pinned copy.
func TestRetainedCopyStaysInPlace(t *testing.T) {
	be := newPinningBackend(t, 2*time.Second)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	const n = 40 << 20 // past pinWaitMax, so the first pause makes a stand-in
	p, err := a.AllocTagged(n, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 0x41, n)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	first, _, err := a.BackupOf(p, 1)
	require.NoError(t, err)
	require.False(t, be.isPinned(first), "a pageable stand-in while the pinning runs")
	_, err = a.ResumeWith(name, alloc.ResumeOptions{Backup: alloc.ResumeRetainBackup})
	require.NoError(t, err)
	host, paused, err := a.BackupOf(p, 1)
	require.NoError(t, err)
	require.False(t, paused)
	require.Equal(t, first, host, "retained where it was")
	require.Eventually(t, func() bool { return be.allocs.Load() == 1 }, 5*time.Second, time.Millisecond)
	poke(t, a, p, 0x42, 1)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	host, _, err = a.BackupOf(p, 1)
	require.NoError(t, err)
	require.Equal(t, first, host, "the next pause saves into the retained copy")
	require.Equal(t, byte(0x42), hostByte(host))
	_, err = a.ResumeWith(name, alloc.ResumeOptions{Backup: alloc.ResumeReleaseBackup})
	require.NoError(t, err)
	require.Equal(t, byte(0x42), peek(t, a, p, 1)[0])
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	host, _, err = a.BackupOf(p, 1)
	require.NoError(t, err)
	require.True(t, be.isPinned(host), "after the release the pinned copy serves")
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.Equal(t, byte(0x42), peek(t, a, p, 1)[0])
	require.Equal(t, byte(0x41), peek(t, a, p+1, 1)[0])
	require.NoError(t, a.Validate())
}

// The free that empties a segment frees a copy that holds what a pause
// saved (nobody can read it any more): while live (a retained copy; the
// segment pins a new one ahead with its next block) and while paused.
func TestLastFreeForgetsTheCopy(t *testing.T) {
	for _, whilePaused := range []bool{false, true} {
		name := "live"
		if whilePaused {
			name = "paused"
		}
		t.Run(name, func(t *testing.T) {
			be := newPinningBackend(t, 0)
			a := newAllocator(t, be)
			tag, id := kindTag(t, "w", alloc.BackupPinned)
			p, err := a.AllocTagged(1<<20, 0, id)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return be.allocs.Load() == 1 }, 5*time.Second, time.Millisecond)
			_, err = a.Pause(tag, alloc.PauseOptions{})
			require.NoError(t, err)
			host, _, err := a.BackupOf(p, 1)
			require.NoError(t, err)
			if !whilePaused {
				_, err = a.ResumeWith(tag, alloc.ResumeOptions{Backup: alloc.ResumeRetainBackup})
				require.NoError(t, err)
			}
			require.NoError(t, a.Free(p, 0, 0))
			require.False(t, be.isPinned(host), "the copy was freed by the free")
			_, _, err = a.BackupOf(p, 1)
			require.Equal(t, core.ErrInvalidState, core.CodeOf(err))
			if whilePaused {
				require.Zero(t, be.liveCount())
				_, err = a.Resume(tag)
				require.NoError(t, err)
			} else {
				time.Sleep(20 * time.Millisecond)
				require.EqualValues(t, 1, be.allocs.Load(), "an empty segment pins nothing")
				q, err := a.AllocTagged(1<<20, 0, id)
				require.NoError(t, err)
				require.Equal(t, p, q, "the same segment again")
				require.Eventually(t, func() bool { return be.allocs.Load() == 2 }, 5*time.Second, time.Millisecond,
					"with its first block the segment pins a new copy ahead")
			}
			require.NoError(t, a.Validate())
		})
	}
}

// A pause right after the allocation of a small segment waits for its
// pinning in flight (about as long as a pageable stand-in would take), so
// that its copy is the pinned one from the first pause.
func TestSmallSegmentWaitsForItsPinning(t *testing.T) {
	noPinsPending(t)
	be := newPinningBackend(t, 100*time.Millisecond)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	p, err := a.AllocTagged(1<<20, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 0x51, 1<<20)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	host, _, err := a.BackupOf(p, 1)
	require.NoError(t, err)
	require.True(t, be.isPinned(host))
	require.Equal(t, byte(0x51), hostByte(host))
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.EqualValues(t, 1, be.allocs.Load())
}

// A pause copies nothing of a segment in which nothing is allocated: no
// host memory, and nothing to restore.
func TestPauseCopiesNoEmptySegment(t *testing.T) {
	t.Cleanup(func() { core.ReloadSettings() })
	t.Setenv("SYMMEM_BACKUP_PIN_AHEAD", "0")
	core.ReloadSettings()
	be := newPinningBackend(t, 0)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	p, err := a.AllocTagged(1<<20, 0, id)
	require.NoError(t, err)
	require.NoError(t, a.Free(p, 0, 0))
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	require.Zero(t, be.allocs.Load(), "no copy of an empty segment")
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.NoError(t, a.Validate())
}

// Behind a queue of pinnings (more pending than run at once) a small
// segment does not wait: the pause copies to pageable stand-ins.
func TestSmallSegmentsBehindAQueueDoNotWait(t *testing.T) {
	noPinsPending(t)
	t.Cleanup(func() { noPinsPending(t) })
	be := newPinningBackend(t, 2*time.Second)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	const n = 20 << 20
	var ptrs []uintptr
	for i := 0; i < 8; i++ {
		p, err := a.AllocTagged(n, 0, id)
		require.NoError(t, err)
		poke(t, a, p, byte(i+1), 1)
		ptrs = append(ptrs, p)
	}
	_, err := a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	standIns := 0
	for _, p := range ptrs {
		host, _, err := a.BackupOf(p, 1)
		require.NoError(t, err)
		if !be.isPinned(host) {
			standIns++
		}
	}
	// The last four were queued behind the first four's two seconds: a
	// wait would have made their copies pinned ones.
	require.GreaterOrEqual(t, standIns, 4, "no wait for the queue")
	_, err = a.Resume(name)
	require.NoError(t, err)
	for i, p := range ptrs {
		require.Equal(t, byte(i+1), peek(t, a, p, 1)[0])
	}
	require.NoError(t, a.Validate())
}

// noPinsPending waits for the pinnings ahead of earlier tests to finish
// (the count that decides whether a pause waits is process-wide).
func noPinsPending(t *testing.T) {
	require.Eventually(t, func() bool { return alloc.PinsPendingForTest() == 0 }, 10*time.Second, time.Millisecond)
}
