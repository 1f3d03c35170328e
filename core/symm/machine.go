package symm

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/libsymmem/libsymmem/core"
	"golang.org/x/sys/unix"
)

// Note [Machine identity]
//
// Two ranks may share memory through this host's sockets and descriptors
// only under one kernel, so a group must know which ranks are on which
// machine, and must never guess it: a wrong answer either refuses a group
// that works or, worse with groups that span machines, puts two real
// machines into one local team, whose ranks would then wait forever for
// descriptors that cannot travel.
//
// The identity is the host name and the kernel's boot id
// (/proc/sys/kernel/random/boot_id), read once when the library loads,
// when descriptors are plentiful (a rank later limited to a handful of
// descriptors cannot open the file). A failure to read it is kept with its
// errno and reported, on the rank where it happened, by the first group that
// rank creates (its member record carries the failure as its status, so
// every rank learns "rank 0: reading the boot id: EMFILE", not a machine
// mismatch).
//
// SYMMEM_MACHINE_ID, a testing setting, replaces the machine's key by a
// name of the tester's choice, so that the ranks of one host can imitate
// several machines. The real boot id still travels in the record, and two
// ranks that claim one machine key with different boot ids are refused: the
// setting can split one machine into several, never merge two. (Two real
// machines without the setting always differ: their keys hold their boot
// ids.)

// machineIdentity is where a process runs.
type machineIdentity struct {
	hostname string
	bootID   string
	// simulated is SYMMEM_MACHINE_ID ("" when unset).
	simulated string
	// err is the failure to read the identity, with its errno; a group
	// refuses to form with it (on the rank that has it).
	err error
}

// key is what ranks of one machine share: the simulated name where set,
// else host name and boot id.
func (m machineIdentity) key() string {
	if m.simulated != "" {
		return "simulated:" + m.simulated
	}
	return m.hostname + "\x00" + m.bootID
}

// String names the machine for messages.
func (m machineIdentity) String() string {
	if m.simulated != "" {
		return fmt.Sprintf("machine %s (SYMMEM_MACHINE_ID on host %s)", core.Quote(m.simulated), m.hostname)
	}
	return fmt.Sprintf("host %s (boot id %s)", m.hostname, m.bootID)
}

// MachineInfo is a machine identity for reports.
type MachineInfo struct {
	Hostname, BootID, Simulated string
	Err                         error
}

// ThisMachine is this process's machine identity, as read at load.
func ThisMachine() MachineInfo {
	m := thisMachine
	return MachineInfo{Hostname: m.hostname, BootID: m.bootID, Simulated: m.simulated, Err: m.err}
}

// maxMachineID bounds SYMMEM_MACHINE_ID: a name, sent in every member record.
const maxMachineID = 256

// bootIDPath is the kernel's boot id.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// thisMachine is read once, when the library loads.
var thisMachine = readMachine(bootIDPath)

// readMachine reads this process's identity; path is the boot id's file.
func readMachine(path string) machineIdentity {
	m := machineIdentity{simulated: core.Current().Text("SYMMEM_MACHINE_ID", "")}
	if len(m.simulated) > maxMachineID {
		// Refused here, on the rank that has it, rather than by the peers
		// as a member record too long to read.
		m.err = core.Errorf(core.ErrInvalidArgument, "SYMMEM_MACHINE_ID=%s is longer than the %d bytes allowed", core.Quote(m.simulated), maxMachineID)
		m.simulated = ""
	}
	var un unix.Utsname
	if err := unix.Uname(&un); err != nil {
		m.err = core.Errorf(core.ErrBackend, "reading this machine's identity: uname: %s", withErrno(err))
		return m
	}
	m.hostname = unix.ByteSliceToString(un.Nodename[:])
	b, err := os.ReadFile(path)
	if err != nil {
		m.err = core.Errorf(core.ErrBackend, "reading this machine's identity (the kernel's boot id) when the library loaded: %s", withErrno(err))
		return m
	}
	m.bootID = strings.TrimSpace(string(b))
	if m.bootID == "" {
		m.err = core.Errorf(core.ErrBackend, "reading this machine's identity: %s is empty", path)
	}
	return m
}

// withErrno describes err with its errno's name: "open ...: too many open
// files (EMFILE: ...)".
func withErrno(err error) string {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return err.Error()
	}
	if d := core.DescribeErrno(err); d != err.Error() {
		return d // names it already
	}
	return fmt.Sprintf("%v (%s)", err, unix.ErrnoName(errno))
}
