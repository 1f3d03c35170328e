package symm

import (
	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/ipc"
)

// socketMembers is the member path of socket groups (Note [Member
// paths]): the ranks connect first over this machine's Unix sockets, and
// the group's records travel on the channel, through its shared-memory
// control page unless SYMMEM_SHM_EXCHANGE=0 (Note [Shared-memory control
// page]). The channel holds one machine, so the members must be on one.
type socketMembers struct {
	o   Options
	ch  *ipc.Channel
	shm *ipc.ShmExchange // the control page when the records use it, else nil
}

// records connects to every rank and carries the records on the channel.
func (m *socketMembers) records(g *Group, tr *phaseTrace) error {
	o := m.o
	ch, err := ipc.Open(ipc.Config{Name: o.Name, Rank: o.Rank, World: o.World, Timeout: o.Timeout, Dir: o.SocketDir, Token: o.JobToken,
		ControlPage: useShmExchange()})
	if err != nil {
		return err
	}
	m.ch, g.ch, g.ex = ch, ch, ch
	tr.mark("connect")
	if useShmExchange() {
		// Records through the group's shared-memory page; descriptors
		// stay on ch.
		if m.shm, err = ipc.NewShmExchange(ch); err != nil {
			return err
		}
		g.ex = m.shm
	}
	tr.mark("control-page")
	return nil
}

// admit: a group over this host's sockets holds one machine.
func (m *socketMembers) admit(g *Group) error {
	if len(g.machines) > 1 {
		ms := g.members
		d := core.RanksByValue(g.world, func(r int) string { return ms[r].machine().String() })
		return core.Errorf(core.ErrMismatch, "group %q: the ranks are on different machines (%s): a group over this host's sockets needs one machine; make it over an NCCL communicator or with an all-gather to span machines", g.name, d)
	}
	return nil
}

// connect has nothing left to do: records already connected the ranks.
func (m *socketMembers) connect(*Group, *phaseTrace) error { return nil }

func (m *socketMembers) cancel() {
	m.ch.Cancel()
	if m.shm != nil {
		m.shm.Cancel()
	}
}

// close closes the control page and the channel, what of them is open.
func (m *socketMembers) close() error {
	if m.shm != nil {
		m.shm.Close()
	}
	if m.ch == nil {
		return nil
	}
	return m.ch.Close()
}

// useShmExchange: records go through a shared-memory page unless
// SYMMEM_SHM_EXCHANGE=0 (every rank must choose alike; the benchmarks use
// it to compare with the sockets).
func useShmExchange() bool { return core.Current().Bool("SYMMEM_SHM_EXCHANGE", true) }
