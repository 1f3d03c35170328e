package symm

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/libsymmem/libsymmem/core/ipc"
)

// gatherMembers is the member path of groups whose records go through an
// all-gather of the caller's (Options.AllGather) or through a communicator
// (Options.Comm, whose commGather makes fn; Note [NCCL groups]), which may
// span machines: the ranks learn every rank's machine from the member
// records first, then open the channel among their local team alone (Note
// [Local teams]).
type gatherMembers struct {
	o  Options
	fn func(send, recv []byte) error
	// done releases what carries fn (the communicator's staging buffers
	// and stream), once the group is closed.
	done func() error
	ch   *ipc.Channel
}

// records carries the records through fn.
func (m *gatherMembers) records(g *Group, _ *phaseTrace) error {
	g.ex = &ipc.FuncExchange{Rank: m.o.Rank, World: m.o.World, Fn: m.fn}
	return nil
}

// admit: an all-gather reaches every machine of the group.
func (m *gatherMembers) admit(*Group) error { return nil }

// connect opens the channel among our socket team.
func (m *gatherMembers) connect(g *Group, tr *phaseTrace) error {
	o := m.o
	// The caller's all-gather already connects exactly this job's ranks:
	// rank 0's nonce is a token that no other job can present.
	token := o.JobToken
	if token == "" {
		token = ipc.JobToken()
	}
	token += "/" + hex.EncodeToString(g.members[0].nonce[:])
	cfg := ipc.Config{Name: o.Name, Rank: g.sockRank, World: len(g.sock), Timeout: o.Timeout, Dir: o.SocketDir, Token: token}
	if len(g.machines) > 1 || g.nteams > 1 {
		// Teams of one group that share a socket directory (machines
		// imitated on one host) must not share a socket.
		cfg.Socket = fmt.Sprintf("%s.team%d", o.Name, g.sock[0])
	}
	ch, err := ipc.Open(cfg)
	if err != nil {
		return err
	}
	m.ch, g.ch = ch, ch
	tr.mark("connect")
	return nil
}

// cancel fails the channel's waits at once; a call inside fn cannot be
// cancelled.
func (m *gatherMembers) cancel() { m.ch.Cancel() }

// close closes the channel, if open, then releases what carries fn.
func (m *gatherMembers) close() error {
	var err error
	if m.ch != nil {
		err = m.ch.Close()
	}
	return errors.Join(err, m.done())
}
