package core

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// attachedValue counts what an Attachment does to it.
type attachedValue struct {
	madeClosed bool
	closes     int
	err        error
}

func (v *attachedValue) Close() error { v.closes++; return v.err }

// An Attachment makes its value once, whoever asks first, and closes it
// once, with the group; a value asked for after the close is made closed
// and never closed again.
func TestAttachmentMakesOnceAndClosesWithTheGroup(t *testing.T) {
	var a Attachment
	made := 0
	newValue := func(closed bool) Closer { made++; return &attachedValue{madeClosed: closed} }
	var wg sync.WaitGroup
	got := make([]Closer, 8)
	for i := range got {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = a.Get(newValue) }()
	}
	wg.Wait()
	require.Equal(t, 1, made)
	v := got[0].(*attachedValue)
	for _, g := range got {
		require.Same(t, v, g)
	}
	require.False(t, v.madeClosed)

	v.err = errors.New("split: injected")
	require.EqualError(t, a.Close(), "split: injected")
	require.NoError(t, a.Close(), "a second close does nothing")
	require.Equal(t, 1, v.closes)
	require.Same(t, v, a.Get(newValue), "the value outlives the close")
	require.Equal(t, 1, made)

	var late Attachment
	require.NoError(t, late.Close(), "nothing made yet: nothing to close")
	w := late.Get(newValue).(*attachedValue)
	require.True(t, w.madeClosed)
	require.Zero(t, w.closes)
}

// The errors of the engine name the group, the machines and the ranks on
// the other machines.
func TestMachineSpanErrors(t *testing.T) {
	m := &MachineSpan{GroupName: "g", Rank: 1, Machines: 2, Here: "a", Remote: "rank(s) 2, 3 on b"}
	require.EqualError(t, m.NoEngine("all_reduce"), `group "g": all_reduce needs an engine between machines: the group spans 2 machines (this is a; rank(s) 2, 3 on b) and was made without a communicator (symmem_group_create_with_allgather); make it over an NCCL communicator (symmem_group_create_nccl)`)
	require.Equal(t, ErrUnavailable, CodeOf(m.NoEngine("x")))
}
