// symmem._torch_ops: the CPU and CUDA kernels of the collectives'
// operators (torch.ops.symmem.all_reduce_, all_reduce_out, all_reduce,
// all_gather, all_gather_out, reduce_scatter, reduce_scatter_out,
// all_reduce_rmsnorm, all_to_all, all_to_all_out, all_to_all_v,
// all_to_all_v_2d, all_to_all_v_2d_offset) in C++, so that compiled code
// reaches the library without entering Python (Note [Operators in C++] in
// symmem/torch.py).
//
// symmem/torch.py defines the operators' schemas and fake implementations;
// this file registers their kernels. A kernel answers from its table,
// which maps (group name, device, address, bytes, collective) to the
// library handle that serves the call, the group's size, and how:
// zero-copy (the tensor lies in a rendezvoused block; symmem_collective
// on its handle), read in place (a tensor of torch's memory that the
// low-latency path reads where it lies; symmem_collective_from on the
// group's staging workspace) or staged (a tensor of torch's memory copied
// into the group's staging workspace, the collective run there). An
// all-reduce, all-gather or reduce-scatter on a tensor the table does not
// hold is decided from the group's workspace, once Python has entered it,
// as Python decides it: libsymmem memory goes to Python (its first call
// rendezvouses, collectively), torch's memory is read in place or staged.
// Any other call not in the table goes to the Python
// kernel (symmem::_py_<name>), which resolves it as the eager path does
// and enters what it resolved here (_cpp_remember). A failed library call
// is raised by the Python side (symmem::_py_raise), which names the error
// as every other call does.
//
// The module links neither libsymmem nor CUDA's libraries: Python hands
// _cpp_bind the addresses of the functions of the library it loaded, and
// the codes of the dtypes, ops and algorithms (include/symmem.h's enums,
// from symmem._enums). Built against the installed torch by
// `python -m symmem build-torch-ops`, for that torch only (the file's
// name carries torch's version and this source's hash).

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#ifdef SYMMEM_TORCH_OPS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

// include/symmem.h's symmem_collective, symmem_collective_from,
// symmem_all_reduce_rmsnorm and symmem_all_reduce_rmsnorm_from.
using collective_fn = int (*)(void *, int, int, int, size_t, void *, int, int, void *);
using collective_from_fn = int (*)(void *, int, int, int, size_t, const void *, void *, int, int, void *);
using rmsnorm_fn = int (*)(void *, int, size_t, size_t, void *, const void *, float, void *, int, void *);
using rmsnorm_from_fn = int (*)(void *, int, size_t, size_t, const void *, void *, const void *, float, void *, int,
                                void *);

// symmem_all_to_all, symmem_all_to_all_v, symmem_all_to_all_v_2d,
// symmem_all_to_all_v_2d_offset.
using all_to_all_fn = int (*)(void *, int, size_t, void *, void *);
using a2a_v_fn = int (*)(void *, size_t, const int64_t *, void *, size_t, int64_t *, void *);
using a2a_v_2d_fn = int (*)(void *, size_t, int, const int64_t *, void *, size_t, int64_t *, int64_t, void *);
using a2a_v_2d_offset_fn = int (*)(void *, size_t, int, const int64_t *, void *, size_t, int64_t *, void *);
// symmem_pointer_get_info (the struct is 48 bytes on LP64).
using pointer_info_fn = int (*)(const void *, void *);

std::atomic<collective_fn> f_collective{nullptr};
std::atomic<all_to_all_fn> f_all_to_all{nullptr};
std::atomic<a2a_v_fn> f_a2a_v{nullptr};
std::atomic<a2a_v_2d_fn> f_a2a_v_2d{nullptr};
std::atomic<a2a_v_2d_offset_fn> f_a2a_v_2d_offset{nullptr};
std::atomic<collective_from_fn> f_collective_from{nullptr};
std::atomic<rmsnorm_fn> f_rmsnorm{nullptr};
std::atomic<rmsnorm_from_fn> f_rmsnorm_from{nullptr};
std::atomic<pointer_info_fn> f_pointer_info{nullptr};

// include/symmem.h's enum symmem_coll; the negative ones are the table's
// own (symmem/torch.py's _CPP_NORM and _CPP_A2A_*): the all-reduce with
// RMSNorm and the split-driven all-to-alls.
constexpr int kAllReduce = 0, kAllGather = 1, kReduceScatter = 2, kAllToAll = 3, kNorm = -1, kA2aV = -2,
              kA2aV2d = -3, kA2aV2dOffset = -4;

// Codes by name, set once by _cpp_bind before any kernel runs.
struct Codes {
  std::array<int, static_cast<size_t>(c10::ScalarType::NumOptions)> dtype{};  // -1: not a library dtype
  std::unordered_map<std::string, int> op, algo;
};
Codes codes;
std::atomic<bool> bound{false};

enum Mode : int64_t { kZeroCopy = 0, kReadInPlace = 1, kStaged = 2 };

// What a staged all-reduce needs beside the codes (set by _cpp_bind): up
// to how many bytes it writes its result straight into the destination,
// and the algorithms that never do (symmem/torch.py's _STAGED_DIRECT_MAX
// and _run_staged).
struct Staging {
  int64_t direct_max = 0;
  int two_shot = -1, hierarchical = -1;
};
Staging staging;

struct Key {
  std::string group;
  int64_t device, address, nbytes, coll;
  bool operator==(const Key &o) const {
    return device == o.device && address == o.address && nbytes == o.nbytes && coll == o.coll && group == o.group;
  }
};

struct KeyHash {
  size_t operator()(const Key &k) const {
    size_t h = std::hash<std::string>()(k.group);
    for (int64_t v : {k.device, k.address, k.nbytes, k.coll})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

struct Entry {
  void *handle;
  int64_t mode;
  int64_t world;
  at::Tensor workspace;  // kStaged: the workspace (uint8) that handle rendezvoused, kept alive here
};

// Bounded as symmem.torch's own table of tensors read in place: cleared
// when it would pass kMaxEntries.
constexpr size_t kMaxEntries = 4096;
std::shared_mutex table_mu;
std::unordered_map<Key, Entry, KeyHash> table;
std::atomic<int64_t> hits{0}, misses{0};

// A group's staging workspace on a device, as symmem/torch.py's _Workspace
// holds it: its handle, the uint8 tensor, the group's size and the bytes
// per rank and peer that the low-latency path reads in place (0: none).
struct Workspace {
  void *handle;
  at::Tensor tensor;
  int64_t world, ll_bytes;
};
struct GroupDevice {
  std::string group;
  int64_t device;
  bool operator==(const GroupDevice &o) const { return device == o.device && group == o.group; }
};
struct GroupDeviceHash {
  size_t operator()(const GroupDevice &k) const {
    return std::hash<std::string>()(k.group) * 1000003u ^ std::hash<int64_t>()(k.device);
  }
};
std::unordered_map<GroupDevice, Workspace, GroupDeviceHash> workspaces;  // under table_mu

int64_t key_device(const at::Tensor &t) { return t.is_cuda() ? t.get_device() : -1; }

void *stream_of(const at::Tensor &t) {
#ifdef SYMMEM_TORCH_OPS_CUDA
  if (t.is_cuda())
    return c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
#endif
  return nullptr;
}

bool aligned16(const at::Tensor &t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// A call the table may answer: its entry and codes.
struct Call {
  Entry entry;
  int dtype, op, algo;
};

// t's entry for coll in group, if the table holds one.
std::optional<Entry> find_entry(int coll, const at::Tensor &t, std::string_view group) {
  if (!bound.load(std::memory_order_acquire) || !t.is_contiguous() || t.numel() == 0)
    return std::nullopt;
  std::shared_lock<std::shared_mutex> lock(table_mu);
  auto it = table.find(Key{std::string(group), key_device(t), reinterpret_cast<int64_t>(t.data_ptr()),
                           static_cast<int64_t>(t.nbytes()), coll});
  if (it == table.end())
    return std::nullopt;
  return it->second;
}

// An entry for a call on a tensor the table does not hold, decided from
// the group's workspace as symmem/torch.py's _run decides it under the auto
// algorithm: none where the workspace is not entered, the tensor is
// libsymmem memory (its first call rendezvouses, which Python does) or
// does not fit the workspace (which Python grows); read in place where
// _reads_in_place says so, else staged.
std::optional<Entry> workspace_entry(int coll, const at::Tensor &t, std::string_view group, int algo) {
  if (algo != 0 || !(coll == kAllReduce || coll == kAllGather || coll == kReduceScatter) ||
      !bound.load(std::memory_order_acquire) || !t.is_contiguous() || t.numel() == 0)
    return std::nullopt;
  Workspace w;
  {
    std::shared_lock<std::shared_mutex> lock(table_mu);
    auto it = workspaces.find(GroupDevice{std::string(group), key_device(t)});
    if (it == workspaces.end())
      return std::nullopt;
    w = it->second;
  }
  std::array<uint64_t, 16> info{};
  if (f_pointer_info.load(std::memory_order_relaxed)(t.data_ptr(), info.data()) == 0)
    return std::nullopt;
  int64_t per = static_cast<int64_t>(t.nbytes());
  bool divides = true;
  if (coll == kReduceScatter) {
    divides = t.numel() % w.world == 0;
    per /= w.world;
  }
  if (w.ll_bytes > 0 && w.world >= 2 && aligned16(t) && divides && per <= w.ll_bytes &&
      (coll == kAllReduce || per % 8 == 0))
    return Entry{w.handle, kReadInPlace, w.world, at::Tensor()};
  if (static_cast<int64_t>(t.nbytes()) > w.tensor.numel())
    return std::nullopt;
  return Entry{w.handle, kStaged, w.world, w.tensor};
}

// The table's answer for the call, or nothing (not in the table, or not a
// call the table may answer: Python decides those).
std::optional<Call> look_up(int coll, const at::Tensor &t, std::string_view op, std::string_view group,
                            std::string_view algo) {
  const int dtype = codes.dtype[static_cast<size_t>(t.scalar_type())];
  auto opc = codes.op.find(std::string(op));
  auto algoc = codes.algo.find(std::string(algo));
  if (dtype < 0 || opc == codes.op.end() || algoc == codes.algo.end())
    return std::nullopt;
  auto e = find_entry(coll, t, group);
  if (!e)
    e = workspace_entry(coll, t, group, algoc->second);
  // Read in place: only the auto algorithm, with a 16-byte aligned input,
  // as symmem.torch decided when it entered the call.
  if (!e || (e->mode == kReadInPlace && (algoc->second != 0 || !aligned16(t))))
    return std::nullopt;
  return Call{*e, dtype, opc->second, algoc->second};
}

// A staged call, as symmem/torch.py's _run_staged runs it: t copied to the
// workspace's start on the current stream, the collective run there,
// writing its result straight into the destination (every all-gather and
// reduce-scatter; an all-reduce up to the direct bytes, unless two-shot or
// hierarchical) or in place in the workspace, copied back. 1 done, 0
// passed back, <0 the library's failure.
int run_staged(int coll, const Call &c, const at::Tensor &t, const at::Tensor *out) {
  const at::Tensor &ws = c.entry.workspace;
  const int64_t nbytes = static_cast<int64_t>(t.nbytes());
  if (!ws.defined() || nbytes > ws.numel() || (coll != kAllReduce && out == nullptr))
    return 0;
  const at::Tensor &dst = out == nullptr ? t : *out;
  at::Tensor stage = ws.narrow(0, 0, nbytes).view(t.scalar_type()).view(t.sizes());
  stage.copy_(t);
  const bool direct = coll != kAllReduce || (nbytes <= staging.direct_max && c.algo != staging.two_shot &&
                                             c.algo != staging.hierarchical);
  const int rc = f_collective.load(std::memory_order_relaxed)(c.entry.handle, coll, c.dtype, c.op,
                                                              static_cast<size_t>(t.numel()),
                                                              direct ? dst.data_ptr() : nullptr, c.algo, 0,
                                                              stream_of(t));
  if (rc != 0)
    return -rc;
  if (!direct)
    dst.copy_(stage);
  hits.fetch_add(1, std::memory_order_relaxed);
  return 1;
}

// Runs a looked-up call into out (nullptr: in place): 1 done, 0 passed
// back (out not as the table's call needs it), <0 the library's failure.
int run(int coll, const Call &c, const at::Tensor &t, const at::Tensor *out) {
  if (out != nullptr && (!out->is_contiguous() || (c.entry.mode == kReadInPlace && !aligned16(*out))))
    return 0;
  if (c.entry.mode == kStaged)
    return run_staged(coll, c, t, out);
  void *dst = out == nullptr ? nullptr : out->data_ptr();
  int rc;
  if (c.entry.mode == kZeroCopy)
    rc = f_collective.load(std::memory_order_relaxed)(c.entry.handle, coll, c.dtype, c.op,
                                                      static_cast<size_t>(t.numel()), dst, c.algo, 0, stream_of(t));
  else
    rc = f_collective_from.load(std::memory_order_relaxed)(c.entry.handle, coll, c.dtype, c.op,
                                                           static_cast<size_t>(t.numel()), t.data_ptr(), dst, 0, 0,
                                                           stream_of(t));
  if (rc != 0)
    return -rc;
  hits.fetch_add(1, std::memory_order_relaxed);
  return 1;
}

int from_table(int coll, const at::Tensor &t, const at::Tensor *out, std::string_view op, std::string_view group,
               std::string_view algo) {
  auto c = look_up(coll, t, op, group, algo);
  return c ? run(coll, *c, t, out) : 0;
}

c10::OperatorHandle python_op(const char *name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

// The library's failure rc, raised by Python with the library's message.
[[noreturn]] void raise_failure(const at::Tensor &t, int rc, const char *what) {
  static const auto op =
      python_op("symmem::_py_raise").typed<void(const at::Tensor &, int64_t, c10::string_view)>();
  op.call(t, rc, what);
  TORCH_CHECK(false, what, ": libsymmem returned ", rc);  // _py_raise raises; this is its backstop
}

// Whether the table answered the call (r: 1 answered, 0 not, <0 the
// library's failure, which is raised); a call not answered is counted as
// passed to Python, which the caller then does.
bool answered(int r, const at::Tensor &t, const char *what) {
  if (r == 1)
    return true;
  if (r < 0)
    raise_failure(t, -r, what);
  misses.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void all_reduce_(const at::Tensor &tensor, c10::string_view op, c10::string_view group, c10::string_view algo) {
  const int r = from_table(kAllReduce, tensor, nullptr, op, group, algo);
  if (answered(r, tensor, "symmem.torch.all_reduce"))
    return;
  static const auto py = python_op("symmem::_py_all_reduce_")
                             .typed<void(const at::Tensor &, c10::string_view, c10::string_view, c10::string_view)>();
  py.call(tensor, op, group, algo);
}

void all_reduce_out(const at::Tensor &tensor, const at::Tensor &out, c10::string_view op, c10::string_view group,
                    c10::string_view algo) {
  const int r = from_table(kAllReduce, tensor, &out, op, group, algo);
  if (answered(r, tensor, "symmem.torch.all_reduce"))
    return;
  static const auto py =
      python_op("symmem::_py_all_reduce_out")
          .typed<void(const at::Tensor &, const at::Tensor &, c10::string_view, c10::string_view, c10::string_view)>();
  py.call(tensor, out, op, group, algo);
}

// The gathered shape: world times the rows (symmem/torch.py's _gather_shape).
std::vector<int64_t> gather_shape(const at::Tensor &t, int64_t world) {
  if (t.dim() == 0)
    return {world};
  std::vector<int64_t> s(t.sizes().begin(), t.sizes().end());
  s[0] *= world;
  return s;
}

// The scattered shape: a world's share of the rows where they divide, else
// of the elements (symmem/torch.py's _scatter_shape); empty where the
// elements do not divide (Python raises, naming it).
std::vector<int64_t> scatter_shape(const at::Tensor &t, int64_t world) {
  if (world <= 0 || t.numel() % world != 0)
    return {};
  if (t.dim() > 0 && t.size(0) % world == 0) {
    std::vector<int64_t> s(t.sizes().begin(), t.sizes().end());
    s[0] /= world;
    return s;
  }
  return {t.numel() / world};
}

at::Tensor all_gather(const at::Tensor &tensor, c10::string_view group) {
  if (auto c = look_up(kAllGather, tensor, "sum", group, "auto")) {
    at::Tensor out = at::empty(gather_shape(tensor, c->entry.world), tensor.options());
    const int r = run(kAllGather, *c, tensor, &out);
    if (r == 1)
      return out;
    if (r < 0)
      raise_failure(tensor, -r, "symmem.torch.all_gather");
  }
  misses.fetch_add(1, std::memory_order_relaxed);
  static const auto py =
      python_op("symmem::_py_all_gather").typed<at::Tensor(const at::Tensor &, c10::string_view)>();
  return py.call(tensor, group);
}

void all_gather_out(const at::Tensor &tensor, const at::Tensor &out, c10::string_view group) {
  const int r = from_table(kAllGather, tensor, &out, "sum", group, "auto");
  if (answered(r, tensor, "symmem.torch.all_gather"))
    return;
  static const auto py = python_op("symmem::_py_all_gather_out")
                             .typed<void(const at::Tensor &, const at::Tensor &, c10::string_view)>();
  py.call(tensor, out, group);
}

at::Tensor reduce_scatter(const at::Tensor &tensor, c10::string_view op, c10::string_view group) {
  if (auto c = look_up(kReduceScatter, tensor, op, group, "auto")) {
    const auto shape = scatter_shape(tensor, c->entry.world);
    if (!shape.empty()) {
      at::Tensor out = at::empty(shape, tensor.options());
      const int r = run(kReduceScatter, *c, tensor, &out);
      if (r == 1)
        return out;
      if (r < 0)
        raise_failure(tensor, -r, "symmem.torch.reduce_scatter");
    }
  }
  misses.fetch_add(1, std::memory_order_relaxed);
  static const auto py = python_op("symmem::_py_reduce_scatter")
                             .typed<at::Tensor(const at::Tensor &, c10::string_view, c10::string_view)>();
  return py.call(tensor, op, group);
}

void reduce_scatter_out(const at::Tensor &tensor, const at::Tensor &out, c10::string_view op,
                        c10::string_view group) {
  const int r = from_table(kReduceScatter, tensor, &out, op, group, "auto");
  if (answered(r, tensor, "symmem.torch.reduce_scatter"))
    return;
  static const auto py =
      python_op("symmem::_py_reduce_scatter_out")
          .typed<void(const at::Tensor &, const at::Tensor &, c10::string_view, c10::string_view)>();
  py.call(tensor, out, op, group);
}

at::Tensor all_reduce(const at::Tensor &tensor, c10::string_view op, c10::string_view group,
                      c10::string_view algo) {
  at::Tensor out = at::empty(tensor.sizes(), tensor.options());
  const int r = from_table(kAllReduce, tensor, &out, op, group, algo);
  if (answered(r, tensor, "symmem.torch.all_reduce"))
    return out;
  static const auto py =
      python_op("symmem::_py_all_reduce_out")
          .typed<void(const at::Tensor &, const at::Tensor &, c10::string_view, c10::string_view, c10::string_view)>();
  py.call(tensor, out, op, group, algo);
  return out;
}

// The all-reduce with RMSNorm from the table: 1 done, 0 not a call the
// table answers (Python checks it and says what is wrong), <0 the
// library's failure. x is [..., hidden]; residual and out have its shape,
// weight is (hidden,); one dtype and device, every tensor contiguous.
int norm_from_table(const at::Tensor &x, const at::Tensor &residual, const at::Tensor &weight, double eps,
                    const at::Tensor &out, std::string_view group, std::string_view algo) {
  if (x.dim() < 1 || residual.sizes() != x.sizes() || out.sizes() != x.sizes() || weight.dim() != 1 ||
      weight.size(0) != x.size(-1) || x.size(-1) == 0)
    return 0;
  for (const at::Tensor *t : {&residual, &weight, &out})
    if (t->scalar_type() != x.scalar_type() || t->device() != x.device() || !t->is_contiguous())
      return 0;
  auto c = look_up(kNorm, x, "sum", group, algo);
  if (!c || c->entry.mode == kStaged)
    return 0;
  const size_t hidden = static_cast<size_t>(x.size(-1)), tokens = static_cast<size_t>(x.numel()) / hidden;
  int rc;
  if (c->entry.mode == kZeroCopy) {
    void *dst = out.data_ptr() == x.data_ptr() ? nullptr : out.data_ptr();
    rc = f_rmsnorm.load(std::memory_order_relaxed)(c->entry.handle, c->dtype, tokens, hidden, residual.data_ptr(),
                                                   weight.data_ptr(), static_cast<float>(eps), dst, c->algo,
                                                   stream_of(x));
  } else {
    if (!aligned16(out))
      return 0;
    rc = f_rmsnorm_from.load(std::memory_order_relaxed)(c->entry.handle, c->dtype, tokens, hidden, x.data_ptr(),
                                                        residual.data_ptr(), weight.data_ptr(),
                                                        static_cast<float>(eps), out.data_ptr(), c->algo,
                                                        stream_of(x));
  }
  if (rc != 0)
    return -rc;
  hits.fetch_add(1, std::memory_order_relaxed);
  return 1;
}

void all_reduce_rmsnorm(const at::Tensor &x, const at::Tensor &residual, const at::Tensor &weight, double eps,
                        const at::Tensor &out, c10::string_view group, c10::string_view algo) {
  const int r = norm_from_table(x, residual, weight, eps, out, group, algo);
  if (answered(r, x, "symmem.torch.all_reduce_rmsnorm"))
    return;
  static const auto py =
      python_op("symmem::_py_all_reduce_rmsnorm")
          .typed<void(const at::Tensor &, const at::Tensor &, const at::Tensor &, double, const at::Tensor &,
                      c10::string_view, c10::string_view)>();
  py.call(x, residual, weight, eps, out, group, algo);
}

// What the split-driven all-to-alls need of their tensors, checked as
// symmem/torch.py's _a2a_check does (anything else goes to Python, which
// says what is wrong): out beside input (rows of the same bytes, one
// dtype and device, contiguous), each split tensor int64, contiguous, on
// input's device, of the shape given.
bool a2a_ok(const at::Tensor &input, const at::Tensor &out,
            std::initializer_list<std::pair<const at::Tensor *, std::vector<int64_t>>> splits) {
  if (input.dim() < 1 || out.dim() < 1 || out.scalar_type() != input.scalar_type() ||
      out.stride(0) != input.stride(0) || !out.is_contiguous() || out.device() != input.device())
    return false;
  for (const auto &[t, shape] : splits)
    if (t->scalar_type() != at::kLong || !t->is_contiguous() || t->device() != input.device() ||
        t->sizes() != c10::IntArrayRef(shape))
      return false;
  return true;
}

// A split-driven all-to-all from the table: run(entry, row bytes) gives
// the library's result, or nothing where its tensors are not as the call
// needs; 1 done, 0 not answered, <0 the library's failure.
template <typename Run>
int a2a_from_table(int coll, const at::Tensor &input, std::string_view group, Run run) {
  auto e = find_entry(coll, input, group);
  if (!e || e->mode != kZeroCopy)
    return 0;
  const std::optional<int> rc = run(*e, static_cast<size_t>(input.stride(0) * input.element_size()));
  if (!rc)
    return 0;
  if (*rc != 0)
    return -*rc;
  hits.fetch_add(1, std::memory_order_relaxed);
  return 1;
}

void all_to_all_v(const at::Tensor &input, const at::Tensor &out, const at::Tensor &in_splits,
                  const at::Tensor &out_splits_offsets, c10::string_view group) {
  const int r = a2a_from_table(kA2aV, input, group, [&](const Entry &e, size_t row_bytes) -> std::optional<int> {
    if (!a2a_ok(input, out, {{&in_splits, {e.world}}, {&out_splits_offsets, {2, e.world}}}))
      return std::nullopt;
    return f_a2a_v.load(std::memory_order_relaxed)(e.handle, row_bytes, in_splits.const_data_ptr<int64_t>(),
                                                   out.data_ptr(), static_cast<size_t>(out.size(0)),
                                                   out_splits_offsets.data_ptr<int64_t>(), stream_of(input));
  });
  if (answered(r, input, "symmem.torch.all_to_all_v"))
    return;
  static const auto py = python_op("symmem::_py_all_to_all_v")
                             .typed<void(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                         const at::Tensor &, c10::string_view)>();
  py.call(input, out, in_splits, out_splits_offsets, group);
}

// The all-to-all of equal splits into out from the table: 1 done, 0 not
// answered, <0 the library's failure. Any dtype: the bytes are moved, as
// the library's dtype where it has it, else as int32 or bfloat16 words
// (symmem/torch.py's _A2A_WORDS).
int all_to_all_from_table(const at::Tensor &input, const at::Tensor &out, std::string_view group) {
  auto e = find_entry(kAllToAll, input, group);
  if (!e || e->mode != kZeroCopy || out.scalar_type() != input.scalar_type() || out.numel() != input.numel() ||
      !out.is_contiguous() || out.device() != input.device() || input.numel() % e->world != 0)
    return 0;
  size_t count = static_cast<size_t>(input.numel() / e->world);
  int dtype = codes.dtype[static_cast<size_t>(input.scalar_type())];
  if (dtype < 0) {
    const size_t chunk = count * input.element_size();
    const int as_int32 = codes.dtype[static_cast<size_t>(at::kInt)];
    const int as_bf16 = codes.dtype[static_cast<size_t>(at::kBFloat16)];
    if (chunk % 4 == 0 && as_int32 >= 0)
      dtype = as_int32, count = chunk / 4;
    else if (chunk % 2 == 0 && as_bf16 >= 0)
      dtype = as_bf16, count = chunk / 2;
    else
      return 0;
  }
  const int rc = f_all_to_all.load(std::memory_order_relaxed)(e->handle, dtype, count, out.data_ptr(),
                                                              stream_of(input));
  if (rc != 0)
    return -rc;
  hits.fetch_add(1, std::memory_order_relaxed);
  return 1;
}

at::Tensor all_to_all(const at::Tensor &input, c10::string_view group) {
  at::Tensor out = at::empty(input.sizes(), input.options());
  const int r = all_to_all_from_table(input, out, group);
  if (answered(r, input, "symmem.torch.all_to_all"))
    return out;
  static const auto py = python_op("symmem::_py_all_to_all_out")
                             .typed<void(const at::Tensor &, const at::Tensor &, c10::string_view)>();
  py.call(input, out, group);
  return out;
}

void all_to_all_out(const at::Tensor &input, const at::Tensor &out, c10::string_view group) {
  const int r = all_to_all_from_table(input, out, group);
  if (answered(r, input, "symmem.torch.all_to_all"))
    return;
  static const auto py = python_op("symmem::_py_all_to_all_out")
                             .typed<void(const at::Tensor &, const at::Tensor &, c10::string_view)>();
  py.call(input, out, group);
}

// experts per rank of n splits in a group of world ranks, or 0.
int64_t experts_of(int64_t n, int64_t world) { return n >= 1 && world > 0 && n % world == 0 ? n / world : 0; }

void all_to_all_v_2d(const at::Tensor &input, const at::Tensor &out, const at::Tensor &in_splits,
                     const at::Tensor &out_splits_offsets, c10::string_view group, int64_t major_align) {
  const int r = a2a_from_table(kA2aV2d, input, group, [&](const Entry &e, size_t row_bytes) -> std::optional<int> {
    const int64_t n = in_splits.dim() == 1 ? in_splits.size(0) : 0, experts = experts_of(n, e.world);
    if (experts == 0 || major_align < 1 || !a2a_ok(input, out, {{&in_splits, {n}}, {&out_splits_offsets, {2, n}}}))
      return std::nullopt;
    return f_a2a_v_2d.load(std::memory_order_relaxed)(
        e.handle, row_bytes, static_cast<int>(experts), in_splits.const_data_ptr<int64_t>(), out.data_ptr(),
        static_cast<size_t>(out.size(0)), out_splits_offsets.data_ptr<int64_t>(), major_align, stream_of(input));
  });
  if (answered(r, input, "symmem.torch.all_to_all_v_2d"))
    return;
  static const auto py = python_op("symmem::_py_all_to_all_v_2d")
                             .typed<void(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                         const at::Tensor &, c10::string_view, int64_t)>();
  py.call(input, out, in_splits, out_splits_offsets, group, major_align);
}

void all_to_all_v_2d_offset(const at::Tensor &input, const at::Tensor &out, const at::Tensor &in_splits_offsets,
                            const at::Tensor &out_splits_offsets, c10::string_view group) {
  const int r = a2a_from_table(kA2aV2dOffset, input, group, [&](const Entry &e, size_t row_bytes) -> std::optional<int> {
    const int64_t n = in_splits_offsets.dim() == 2 ? in_splits_offsets.size(1) : 0, experts = experts_of(n, e.world);
    if (experts == 0 ||
        !a2a_ok(input, out, {{&in_splits_offsets, {2, n}}, {&out_splits_offsets, {2, n}}}))
      return std::nullopt;
    return f_a2a_v_2d_offset.load(std::memory_order_relaxed)(
        e.handle, row_bytes, static_cast<int>(experts), in_splits_offsets.const_data_ptr<int64_t>(), out.data_ptr(),
        static_cast<size_t>(out.size(0)), out_splits_offsets.data_ptr<int64_t>(), stream_of(input));
  });
  if (answered(r, input, "symmem.torch.all_to_all_v_2d_offset"))
    return;
  static const auto py = python_op("symmem::_py_all_to_all_v_2d_offset")
                             .typed<void(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                         const at::Tensor &, c10::string_view)>();
  py.call(input, out, in_splits_offsets, out_splits_offsets, group);
}

// The control operators, called by symmem/torch.py.

void cpp_bind(int64_t collective, int64_t collective_from, int64_t rmsnorm, int64_t rmsnorm_from, int64_t all_to_all,
              int64_t a2a_v, int64_t a2a_v_2d, int64_t a2a_v_2d_offset, int64_t pointer_info,
              const std::vector<at::Tensor> &dtype_samples,
              std::vector<int64_t> dtype_codes, std::vector<std::string> op_names, std::vector<int64_t> op_codes,
              std::vector<std::string> algo_names, std::vector<int64_t> algo_codes, int64_t staged_direct_max) {
  TORCH_CHECK(collective != 0 && collective_from != 0 && rmsnorm != 0 && rmsnorm_from != 0 && all_to_all != 0 &&
                  a2a_v != 0 && a2a_v_2d != 0 && a2a_v_2d_offset != 0 && pointer_info != 0,
              "symmem::_cpp_bind: a function address is 0");
  TORCH_CHECK(dtype_samples.size() == dtype_codes.size() && op_names.size() == op_codes.size() &&
                  algo_names.size() == algo_codes.size(),
              "symmem::_cpp_bind: names and codes differ in number");
  std::unique_lock<std::shared_mutex> lock(table_mu);
  if (bound.load(std::memory_order_relaxed))
    return;  // bound once: the kernels read the codes without the lock
  codes.dtype.fill(-1);
  for (size_t i = 0; i < dtype_samples.size(); i++)
    codes.dtype[static_cast<size_t>(dtype_samples[i].scalar_type())] = static_cast<int>(dtype_codes[i]);
  for (size_t i = 0; i < op_names.size(); i++)
    codes.op[op_names[i]] = static_cast<int>(op_codes[i]);
  for (size_t i = 0; i < algo_names.size(); i++)
    codes.algo[algo_names[i]] = static_cast<int>(algo_codes[i]);
  staging.direct_max = staged_direct_max;
  for (auto &[name, code] : {std::pair<const char *, int *>{"two_shot", &staging.two_shot},
                             std::pair<const char *, int *>{"hierarchical", &staging.hierarchical}}) {
    auto it = codes.algo.find(name);
    *code = it == codes.algo.end() ? -1 : it->second;
  }
  f_collective.store(reinterpret_cast<collective_fn>(collective), std::memory_order_relaxed);
  f_collective_from.store(reinterpret_cast<collective_from_fn>(collective_from), std::memory_order_relaxed);
  f_rmsnorm.store(reinterpret_cast<rmsnorm_fn>(rmsnorm), std::memory_order_relaxed);
  f_rmsnorm_from.store(reinterpret_cast<rmsnorm_from_fn>(rmsnorm_from), std::memory_order_relaxed);
  f_all_to_all.store(reinterpret_cast<all_to_all_fn>(all_to_all), std::memory_order_relaxed);
  f_a2a_v.store(reinterpret_cast<a2a_v_fn>(a2a_v), std::memory_order_relaxed);
  f_a2a_v_2d.store(reinterpret_cast<a2a_v_2d_fn>(a2a_v_2d), std::memory_order_relaxed);
  f_a2a_v_2d_offset.store(reinterpret_cast<a2a_v_2d_offset_fn>(a2a_v_2d_offset), std::memory_order_relaxed);
  f_pointer_info.store(reinterpret_cast<pointer_info_fn>(pointer_info), std::memory_order_relaxed);
  bound.store(true, std::memory_order_release);
}

void cpp_remember(c10::string_view group, const at::Tensor &tensor, int64_t coll, int64_t handle, int64_t mode,
                  int64_t world, const std::optional<at::Tensor> &workspace) {
  TORCH_CHECK(handle != 0 && (mode == kZeroCopy || mode == kReadInPlace || mode == kStaged) && world > 0,
              "symmem::_cpp_remember: handle ", handle, ", mode ", mode, ", world ", world);
  const bool staged = mode == kStaged;
  TORCH_CHECK(staged == (workspace.has_value() && workspace->defined()),
              "symmem::_cpp_remember: a workspace goes with the staged mode, and only with it");
  TORCH_CHECK(!staged || ((coll == kAllReduce || coll == kAllGather || coll == kReduceScatter) &&
                          workspace->scalar_type() == at::kByte && workspace->dim() == 1 &&
                          workspace->is_contiguous() && workspace->device() == tensor.device()),
              "symmem::_cpp_remember: a staged call is an all-reduce, all-gather or reduce-scatter, its workspace "
              "contiguous uint8 on the tensor's device");
  std::unique_lock<std::shared_mutex> lock(table_mu);
  if (table.size() >= kMaxEntries)
    table.clear();
  table[Key{std::string(group), key_device(tensor), reinterpret_cast<int64_t>(tensor.data_ptr()),
            static_cast<int64_t>(tensor.nbytes()), coll}] =
      Entry{reinterpret_cast<void *>(handle), mode, world, staged ? *workspace : at::Tensor()};
}

// Enters a group's staging workspace on tensor's device (replacing the
// one entered before, which a larger call outgrew).
void cpp_workspace(c10::string_view group, const at::Tensor &workspace, int64_t handle, int64_t world,
                   int64_t ll_bytes) {
  TORCH_CHECK(handle != 0 && world > 0 && ll_bytes >= 0 && workspace.scalar_type() == at::kByte &&
                  workspace.dim() == 1 && workspace.is_contiguous(),
              "symmem::_cpp_workspace: handle ", handle, ", world ", world, ", ll_bytes ", ll_bytes,
              ", a contiguous uint8 workspace");
  std::unique_lock<std::shared_mutex> lock(table_mu);
  workspaces[GroupDevice{std::string(group), key_device(workspace)}] =
      Workspace{reinterpret_cast<void *>(handle), workspace, world, ll_bytes};
}

// Drops the entries of handle (0: every entry and workspace).
void cpp_forget(int64_t handle) {
  std::unique_lock<std::shared_mutex> lock(table_mu);
  if (handle == 0) {
    table.clear();
    workspaces.clear();
    return;
  }
  for (auto it = table.begin(); it != table.end();)
    it = reinterpret_cast<int64_t>(it->second.handle) == handle ? table.erase(it) : std::next(it);
}

// [calls answered from the table, calls passed to Python, entries].
std::vector<int64_t> cpp_stats() {
  std::shared_lock<std::shared_mutex> lock(table_mu);
  return {hits.load(), misses.load(), static_cast<int64_t>(table.size())};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(symmem, m) {
  m.def("_cpp_bind(int collective, int collective_from, int rmsnorm, int rmsnorm_from, int all_to_all, int a2a_v, "
        "int a2a_v_2d, int a2a_v_2d_offset, int pointer_info, Tensor[] dtype_samples, int[] dtype_codes, "
        "str[] op_names, "
        "int[] op_codes, str[] algo_names, int[] algo_codes, int staged_direct_max) -> ()",
        &cpp_bind);
  m.def("_cpp_remember(str group, Tensor tensor, int coll, int handle, int mode, int world, Tensor? workspace=None) "
        "-> ()",
        &cpp_remember);
  m.def("_cpp_workspace(str group, Tensor workspace, int handle, int world, int ll_bytes) -> ()", &cpp_workspace);
  m.def("_cpp_forget(int handle) -> ()", &cpp_forget);
  m.def("_cpp_stats() -> int[]", &cpp_stats);
}

namespace {

// The kernels, for CPU tensors (the host backend) and CUDA ones alike.
void register_kernels(torch::Library &m) {
  m.impl("all_reduce_", &all_reduce_);
  m.impl("all_reduce_out", &all_reduce_out);
  m.impl("all_reduce", &all_reduce);
  m.impl("all_gather", &all_gather);
  m.impl("all_gather_out", &all_gather_out);
  m.impl("reduce_scatter", &reduce_scatter);
  m.impl("reduce_scatter_out", &reduce_scatter_out);
  m.impl("all_reduce_rmsnorm", &all_reduce_rmsnorm);
  m.impl("all_to_all", &all_to_all);
  m.impl("all_to_all_out", &all_to_all_out);
  m.impl("all_to_all_v", &all_to_all_v);
  m.impl("all_to_all_v_2d", &all_to_all_v_2d);
  m.impl("all_to_all_v_2d_offset", &all_to_all_v_2d_offset);
}

}  // namespace

TORCH_LIBRARY_IMPL(symmem, CPU, m) { register_kernels(m); }

#ifdef SYMMEM_TORCH_OPS_CUDA
TORCH_LIBRARY_IMPL(symmem, CUDA, m) { register_kernels(m); }
#endif
