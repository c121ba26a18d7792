// The dispatch front: a C++ boxed fallback, below autograd, that stands in for RoundingMode's
// Python __torch_dispatch__ on CPU and on a GPU (front.py says when).
//
// Why: a TorchDispatchMode costs some 9 us of Python for every ATen op a step runs, and half the
// ops of a step round nothing (views, copies, indexing). Here those ops run with no Python at all,
// and an op that rounds calls Python once, with only the float64 tensors it produced or changed.
// What counts as produced or changed, and each op's class, is what dispatch/optable.py says: the classes
// come from its Python code (once per op), and touched() below mirrors opplan.touched_by() line by line.
//
// Where the C kernels take a tensor (a contiguous float64 CPU tensor: an exact op's output, or an
// inexact op's output in a record or replay of either log format), the front calls the kernel
// itself, as the mode's Python would (dispatch/roles.py's _round_direct, bandcheck's fused kernels), and keeps the step's op index, replay cursor, new log
// records and counters; it hands them to Python with its next call and when it is switched off.
// Anything else, and any tensor a kernel refuses, goes to Python, which words the errors. An inexact
// op with a float32 argument runs again on its float64 twin (widen_stack, as dispatch/widen.py
// does): the twin's results are what is rounded, and they are then written into the op's own. One
// with a float32 result and no float32 argument (torch's default dtype) runs again under a float64
// default instead (widen.default_twin). A call torch refuses for taking float32 tensors beside
// float64 ones runs again as its float64 twin alone (widen.mixed).
//
// The fallback sits on DispatchKey::Fake, a key reserved for out-of-tree code below autograd
// (every key the Python API exposes there already holds a fallback). It is switched on for one
// thread by including the key in that thread's local dispatch key set; autograd's engine carries
// that set to the backward pass.
//
// On CPU autograd runs the backward pass on the thread that called it, which holds the session.
// On a GPU it runs it on a device thread of its own, which gets the key but not the thread-local
// session. A session entered as shared (a step on a device, or one that defers its checks) is
// also listed process-wide, and a thread with the key and no session of its own takes the one
// listed; with two listed it cannot tell whose op it has, and raises. One session is never used
// by two threads at once (the caller waits while autograd's device thread runs): if it were, the
// op order, and so the log, would depend on the threads' timing, and the front raises instead.

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::Fake;

// An op's class as intercept.OpClass has it, or how to work it out from the arguments.
enum Kind : int {
  kMove = 0,
  kExact = 1,
  kInexact = 2,
  kAlpha = 3,       // add, sub, rsub: exact when alpha == 1
  kDiv = 4,         // div: exact with no rounding mode and a divisor of real tensors
  kAccumulate = 5,  // index_put: a move, unless it accumulates
  kGradient = 6,    // prod, cumprod: inexact, unless differentiated: then kRefused
  kRefused = 7,     // a call Python refuses (RoundingMode._front_op words it)
  kComplex = 8,     // mul, abs, sqrt, sgn: exact, unless a tensor argument is complex (div asks too)
};

struct Plan {
  int id = 0;                 // the op's row in front.py's table
  std::string name;           // str(op), the name the log records
  int kind = kInexact;
  int arg = -1;               // position of alpha / rounding_mode / accumulate, -1 when absent
  std::vector<int> written;   // positions the schema marks Tensor(a!)
  std::vector<int> hidden;    // positions written without a mark (batch norm's running stats)
  int training = -1;          // position of the flag that turns the hidden writes on
  int full = -1;              // position of a flag set true: the call the Python mode sees (optable.FULL_CALLS)
};

std::mutex plans_lock;
std::unordered_map<const c10::FunctionSchema*, Plan> plans;

// The C kernels (kernels.c), by address from Python's ctypes handle.
using InplaceFn = int64_t (*)(int64_t*, int64_t, int64_t, int64_t);
using RecordFn = int64_t (*)(int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t*);
using ReplayFn = int64_t (*)(int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, const int64_t*, int64_t,
                             int64_t, int64_t*);
using TritsRecordFn = int64_t (*)(int64_t*, int64_t, int64_t, int64_t, int64_t, uint8_t*);
using TritsReplayFn = int64_t (*)(int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, const uint8_t*, int64_t*);

// One record of the chunk being replayed: a sparse log's positions (size of them from offset in
// Direct::positions), or a packed log's trits (payload).
struct Entry {
  int64_t index = 0;
  int name = 0;  // in Direct::names
  int64_t count = 0;
  int64_t offset = 0, size = 0;
  at::Tensor payload;
};

// A packed-log record the front made, not yet in the Python log: its trits.
struct Record {
  int64_t index = 0;
  int row = 0;
  int64_t count = 0;
  at::Tensor payload;
};

// The sparse-log records the front made, not yet in the Python log, as columns: per record (op
// index, row, count, entries), and every record's positions one after another. Python takes them
// as two tensors, with no object per record: a gpt-shakespeare step makes some 200, and an object
// each, with the garbage collections they set off, cost its trainer about 0.8 ms of a 22 ms step.
struct SparseRecords {
  std::vector<int64_t> table;
  std::vector<int64_t> positions;
};

// What the front does with the C kernels in one session; every kernel null: all to Python.
struct Direct {
  InplaceFn round_inplace = nullptr;  // exact ops' tensors
  InplaceFn round_nearest = nullptr;  // inexact ops' tensors when there is no log (mode "round")
  RecordFn record = nullptr;          // inexact ops' tensors, sparse record
  ReplayFn replay = nullptr;          // inexact ops' tensors, sparse replay
  TritsRecordFn trits_record = nullptr;  // inexact ops' tensors, packed record
  TritsReplayFn trits_replay = nullptr;  // inexact ops' tensors, packed replay
  int64_t k0 = 0, max_finite = 0;     // the grid
  int64_t threshold = 0;              // the packed log's floor(tau * step), in float64 ulps
  int64_t count_free = 0;
  PyObject* band_for = nullptr;       // row -> (rel, abs), the kernels' band of the op
  std::vector<std::array<int64_t, 2>> bands;  // by row
  std::vector<char> have_band;
  std::vector<Entry> entries;
  std::vector<std::string> names;  // the entries' op names
  at::Tensor positions;            // a sparse replay's positions, every entry's one after another
  int64_t op_index = 0;  // the step's logged tensors so far (RoundingMode.op_index)
  int64_t cursor = 0;    // entries taken so far (the replay cursor's position)
  bool in_python = false;  // a Python call raised: its op index and cursor are newer than these
  std::vector<Record> records;   // packed record
  SparseRecords sparse;          // sparse record
  std::vector<int64_t> logged, rounded;  // by row, since the session began
  int64_t corrections = 0, free = 0, tensors = 0;
};

// One thread's session, between enter() and leave().
struct Session {
  bool active = false;
  PyObject* plan_for = nullptr;  // (schema name, overload) -> (id, kind, arg, written, hidden, training, name)
  PyObject* on_op = nullptr;     // (id, class, [tensors], op index, cursor, [records]) -> (op index, cursor)
  std::vector<char> seen;        // by plan id: whether first_calls has the op
  std::vector<std::pair<int, int>> first_calls;  // (plan id, class of its first call), in call order
  bool prior_included = false;
  bool shared = false;             // listed for other threads (see the top of the file)
  std::atomic<bool> busy{false};   // a thread is in fallback() with it
  Direct direct;
};

thread_local Session session;
// The shared sessions open now, in any thread.
std::mutex shared_lock;
std::vector<Session*> shared_sessions;

// The session for an op on this thread: its own, else the one shared session; null for none.
Session* session_here() {
  if (session.active) return &session;
  std::lock_guard<std::mutex> guard(shared_lock);
  if (shared_sessions.empty()) return nullptr;
  if (shared_sessions.size() > 1)
    throw std::runtime_error(
        "the dispatch front: an op on a thread without a session (autograd's device thread) while two "
        "shared sessions are open: run each rounding step on a device in a process of its own, or set "
        "VGAME_FRONT=0");
  return shared_sessions.front();
}

// Holds a session for one op; raises if another thread holds it.
struct Held {
  Session& s;
  explicit Held(Session& held) : s(held) {
    if (s.busy.exchange(true))
      throw std::runtime_error(
          "the dispatch front: two threads ran ops of one rounding step at once, so their order (and "
          "the log) would depend on timing: keep a step's model and data on one device, or set VGAME_FRONT=0");
  }
  ~Held() { s.busy.store(false); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
};
// The record kernel needs room for n positions (it writes m <= n). Up to kScratchMax of them this
// thread's buffer, reused; a larger tensor gets a fresh allocation whose untouched pages cost
// nothing (a buffer kept at the largest size would hold tens of MB at the paper shapes).
constexpr int64_t kScratchMax = int64_t{1} << 20;
thread_local std::vector<int64_t> scratch;

const Plan& plan_of(const c10::OperatorHandle& op, Session& s) {
  const c10::FunctionSchema* key = &op.schema();
  {
    std::lock_guard<std::mutex> guard(plans_lock);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
  }
  py::gil_scoped_acquire gil;
  py::object row = py::reinterpret_borrow<py::object>(s.plan_for)(op.schema().name(), op.schema().overload_name());
  auto t = row.cast<py::tuple>();
  Plan plan;
  plan.id = t[0].cast<int>();
  plan.kind = t[1].cast<int>();
  plan.arg = t[2].cast<int>();
  plan.written = t[3].cast<std::vector<int>>();
  plan.hidden = t[4].cast<std::vector<int>>();
  plan.training = t[5].cast<int>();
  plan.name = t[6].cast<std::string>();
  plan.full = t[7].cast<int>();
  std::lock_guard<std::mutex> guard(plans_lock);
  return plans.emplace(key, std::move(plan)).first->second;  // std::unordered_map keeps references
}

bool equals_one(const c10::IValue& v) {  // Python's `alpha == 1`
  if (!v.isScalar()) return false;
  c10::Scalar s = v.toScalar();
  if (s.isBoolean()) return s.toBool();
  if (s.isIntegral(false)) return s.toLong() == 1;
  if (s.isFloatingPoint()) return s.toDouble() == 1.0;
  if (s.isComplex()) {
    auto c = s.toComplexDouble();
    return c.real() == 1.0 && c.imag() == 0.0;
  }
  return false;
}

bool big_tensors(const c10::IValue& v) {  // intercept._is_big_tensor
  if (v.isTensor()) return v.toTensor().dim() > 0;
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (!big_tensors(e)) return false;
    return true;
  }
  return false;
}

bool complex_argument(const torch::jit::Stack& stack, size_t base) {  // optable.COMPLEX_INEXACT
  for (size_t i = base; i < stack.size(); ++i)
    if (stack[i].isTensor() && stack[i].toTensor().defined() && stack[i].toTensor().is_complex()) return true;
  return false;
}

int conditional(const Plan& plan, const torch::jit::Stack& stack, size_t base) {  // opplan.conditional_class
  switch (plan.kind) {
    case kComplex:
      return complex_argument(stack, base) ? kInexact : kExact;
    case kAlpha:
      return plan.arg < 0 || equals_one(stack[base + plan.arg]) ? kExact : kInexact;
    case kDiv:
      if (complex_argument(stack, base) || (plan.arg >= 0 && !stack[base + plan.arg].isNone())) return kInexact;
      return big_tensors(stack[base + 1]) ? kExact : kInexact;
    case kAccumulate:
      return stack[base + plan.arg].toBool() ? kInexact : kMove;
    case kGradient: {  // opplan.conditional_class: its first argument requires grad, grad mode on
      const c10::IValue& x = stack[base];
      return x.isTensor() && x.toTensor().requires_grad() && at::GradMode::is_enabled() ? kRefused : kInexact;
    }
    default:
      return plan.kind;
  }
}

void collect(const c10::IValue& v, std::vector<at::Tensor>& out) {  // intercept._tensors
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined()) out.push_back(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) collect(e, out);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) collect(e, out);
  }
}

bool same_key(const at::Tensor& a, const at::Tensor& b) {  // intercept._key equality
  return a.storage().data() == b.storage().data() && a.storage_offset() == b.storage_offset() &&
         a.sizes() == b.sizes() && a.strides() == b.strides() && a.scalar_type() == b.scalar_type();
}

// opplan.touched_by: arguments the op wrote, then its outputs that are not among them.
std::vector<at::Tensor> touched(std::vector<at::Tensor> found, const torch::jit::Stack& stack, size_t nret) {
  const size_t rbase = stack.size() - nret;
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < nret; ++i) collect(stack[rbase + i], outs);
  if (found.empty()) return outs;
  if (nret == 1 && stack[rbase].isTensor()) {  // an in-place op returns its self
    const c10::TensorImpl* out = stack[rbase].toTensor().unsafeGetTensorImpl();
    for (const at::Tensor& t : found)
      if (t.unsafeGetTensorImpl() == out) return found;
  }
  std::vector<at::Tensor> seen = found;
  for (const at::Tensor& t : outs) {
    bool known = false;
    for (const at::Tensor& k : seen)
      if (same_key(k, t)) {
        known = true;
        break;
      }
    if (!known) {
      seen.push_back(t);
      found.push_back(t);
    }
  }
  return found;
}

void bump(std::vector<int64_t>& counts, int row) {
  if (static_cast<size_t>(row) >= counts.size()) counts.resize(row + 1, 0);
  ++counts[row];
}

const std::array<int64_t, 2>& band_of(Direct& d, int row) {
  if (static_cast<size_t>(row) >= d.bands.size()) {
    d.bands.resize(row + 1);
    d.have_band.resize(row + 1, 0);
  }
  if (!d.have_band[row]) {
    py::gil_scoped_acquire gil;
    auto t = py::reinterpret_borrow<py::object>(d.band_for)(row).cast<py::tuple>();
    d.bands[row] = {t[0].cast<int64_t>(), t[1].cast<int64_t>()};
    d.have_band[row] = 1;
  }
  return d.bands[row];
}

bool kernel_lanes(const at::Tensor& t) {  // what native._usable asks of a tensor
  return t.device().is_cpu() && t.scalar_type() == at::kDouble && t.is_contiguous() && t.numel() > 0;
}

// Round one tensor with a C kernel, as RoundingMode._front_op would; false, with the tensor
// untouched (or, rounded to nearest, partly rounded, which rounding again leaves as it is), when
// Python must do it.
bool round_direct(Direct& d, const Plan& plan, int cls, const at::Tensor& t) {
  // To nearest: an exact op's tensor, and in mode "round" (no log) an inexact one too, which takes
  // an op index as RoundingMode._round_inexact counts it.
  if (cls == kExact || d.round_nearest != nullptr) {
    const InplaceFn nearest = cls == kExact ? d.round_inplace : d.round_nearest;
    if (nearest == nullptr || !kernel_lanes(t)) return false;
    if (nearest(static_cast<int64_t*>(t.data_ptr()), t.numel(), d.k0, d.max_finite) != 0) return false;
    if (cls != kExact) ++d.op_index;
    bump(d.rounded, plan.id);
    ++d.tensors;
    return true;
  }
  const bool logs = d.record != nullptr || d.replay != nullptr || d.trits_record != nullptr || d.trits_replay != nullptr;
  if (!logs || !kernel_lanes(t)) return false;
  const int64_t n = t.numel();
  const auto& band = band_of(d, plan.id);
  auto* x = static_cast<int64_t*>(t.data_ptr());
  if (d.record != nullptr) {
    const auto longs = at::TensorOptions().dtype(at::kLong);
    at::Tensor fresh;
    int64_t* room = nullptr;
    if (n <= kScratchMax) {
      if (scratch.size() < static_cast<size_t>(n)) scratch.resize(std::max<int64_t>(n, int64_t{1} << 12));
      room = scratch.data();
    } else {
      fresh = at::empty({n}, longs);
      room = fresh.data_ptr<int64_t>();
    }
    const int64_t m = d.record(x, n, d.k0, d.max_finite, band[0], band[1], room);
    if (m < 0) return false;
    d.sparse.table.insert(d.sparse.table.end(), {d.op_index, static_cast<int64_t>(plan.id), n, m});
    d.sparse.positions.insert(d.sparse.positions.end(), room, room + m);
  } else if (d.trits_record != nullptr) {
    at::Tensor trits = at::empty({n}, at::TensorOptions().dtype(at::kByte));
    if (d.trits_record(x, n, d.k0, d.max_finite, d.threshold, trits.data_ptr<uint8_t>()) != 0) return false;
    d.records.push_back({d.op_index, plan.id, n, std::move(trits)});
  } else {
    if (d.cursor >= static_cast<int64_t>(d.entries.size())) return false;
    const Entry& e = d.entries[d.cursor];
    if (e.index != d.op_index || e.count != n || d.names[e.name] != plan.name) return false;
    int64_t stats[2] = {0, 0};
    if (d.replay != nullptr) {
      const int64_t* load = d.positions.data_ptr<int64_t>() + e.offset;  // checked in set_direct
      const int64_t rc = d.replay(x, n, d.k0, d.max_finite, band[0], band[1], load, e.size, d.count_free, stats);
      if (rc != 0) return false;
      d.corrections += stats[0];
      d.free += std::max<int64_t>(stats[1], 0);
    } else {
      const at::Tensor& load = e.payload;
      if (!load.device().is_cpu() || load.scalar_type() != at::kByte || !load.is_contiguous()) return false;
      if (load.numel() != n) return false;
      const int64_t moved =
          d.trits_replay(x, n, d.k0, d.max_finite, band[0], band[1], load.data_ptr<uint8_t>(), stats);
      if (moved < 0) return false;
      d.corrections += moved;
    }
    ++d.cursor;
  }
  ++d.op_index;
  bump(d.logged, plan.id);
  ++d.tensors;
  return true;
}

at::Tensor longs_of(const std::vector<int64_t>& v, int64_t columns) {
  at::Tensor out = at::empty({static_cast<int64_t>(v.size()) / columns, columns}, at::TensorOptions().dtype(at::kLong));
  if (!v.empty()) std::memcpy(out.data_ptr(), v.data(), v.size() * sizeof(int64_t));
  return out;
}

// The records made since Python last took them (with the GIL): in a sparse record, (table, positions)
// as SparseRecords has them, a (k, 4) and a flat int64 tensor; else a list of (op index, row, count,
// trits), empty unless in a packed record.
py::object take_records(Direct& d) {
  if (d.record != nullptr) {
    py::tuple out = py::make_tuple(longs_of(d.sparse.table, 4), longs_of(d.sparse.positions, 1).view({-1}));
    d.sparse.table.clear();
    d.sparse.positions.clear();
    return out;
  }
  py::list out;
  for (Record& r : d.records) out.append(py::make_tuple(r.index, r.row, r.count, std::move(r.payload)));
  d.records.clear();
  return out;
}

void note(Session& s, int id, int cls) {
  if (static_cast<size_t>(id) >= s.seen.size()) s.seen.resize(id + 1, 0);
  if (!s.seen[id]) {
    s.seen[id] = 1;
    s.first_calls.emplace_back(id, cls);
  }
}

// The precisions widened: float32 (and complex64); with `halves` (a mixed call's, widen.MIXED)
// also float16 and bfloat16.
bool narrow_type(at::ScalarType st, bool halves = false) {
  return st == at::kFloat || st == at::kComplexFloat || (halves && (st == at::kHalf || st == at::kBFloat16));
}

// Whether a ScalarType argument (or an optional one) of the schema holds a precision widened.
bool asks_float(const c10::Argument& a, const c10::IValue& v, bool halves = false) {
  if (!v.isInt()) return false;
  c10::TypePtr type = a.real_type();  // a ScalarType's type() is int, its "fake" type
  if (type->kind() == c10::TypeKind::OptionalType) type = type->castRaw<c10::OptionalType>()->getElementType();
  return type->kind() == c10::TypeKind::ScalarTypeType && narrow_type(static_cast<at::ScalarType>(v.toInt()), halves) &&
         v.toInt() != static_cast<int64_t>(at::kComplexFloat);
}

// widen._wide_dtype: float32 (and float16, bfloat16) and complex64 tensors are widened, to float64 and complex128.
at::ScalarType wide_type(at::ScalarType st) { return st == at::kComplexFloat ? at::kComplexDouble : at::kDouble; }

bool narrow_value(const c10::IValue& v, bool halves = false) {
  if (v.isTensor()) return v.toTensor().defined() && narrow_type(v.toTensor().scalar_type(), halves);
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (narrow_value(e, halves)) return true;
  }
  return false;
}

// widen.narrow_inputs: a float32 (or complex64) tensor among the arguments, or a float32 dtype asked
// for; with `halves` (a step's, widen.IN_STEP) float16 and bfloat16 too.
bool narrow_inputs(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t base,
                   bool halves = false) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i)
    if (narrow_value(stack[base + i], halves) || asks_float(args[i], stack[base + i], halves)) return true;
  return false;
}

// Adds what kinds of floating tensor v holds: float32 (or complex64), float64 (or complex128).
void float_kinds(const c10::IValue& v, bool& narrow, bool& wide) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return;
    const at::ScalarType st = t.scalar_type();
    narrow = narrow || narrow_type(st, true);
    wide = wide || st == at::kDouble || st == at::kComplexDouble;
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) float_kinds(e, narrow, wide);
  }
}

// widen.mixed: float32 tensors beside float64 ones among the arguments (a call torch may refuse).
bool mixed_inputs(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t base) {
  bool narrow = false, wide = false;
  for (size_t i = 0; i < schema.arguments().size() && !(narrow && wide); ++i)
    float_kinds(stack[base + i], narrow, wide);
  return narrow && wide;
}

c10::IValue widen_value(const c10::IValue& v, bool halves = false) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && narrow_type(t.scalar_type(), halves) ? c10::IValue(t.to(wide_type(t.scalar_type()))) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector())
      out.push_back(narrow_type(t.scalar_type(), halves) ? t.to(wide_type(t.scalar_type())) : t);
    return out;
  }
  if (v.isList() && narrow_value(v, halves)) {  // Tensor?[]
    c10::List<std::optional<at::Tensor>> out;
    for (const c10::IValue& e : v.toListRef())
      out.push_back(e.isTensor() ? std::optional<at::Tensor>(widen_value(e, halves).toTensor()) : std::nullopt);
    return out;
  }
  return v;
}

// widen.widened: the call's float64 twin, float32 tensors copied to float64 before the call (an
// in-place op's twin starts from the values the op starts from), a float32 dtype made float64.
torch::jit::Stack widen_stack(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t base,
                               bool halves = false) {
  const auto& args = schema.arguments();
  torch::jit::Stack wide;
  wide.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[base + i];
    wide.push_back(asks_float(args[i], v, halves) ? c10::IValue(static_cast<int64_t>(at::kDouble))
                                                  : widen_value(v, halves));
  }
  return wide;
}

// widen.writes_apart: the twin's own copy of each tensor the op writes that widening left as it was
// (a float64 one, the same tensor): else the twin writes it a second time, and an in-place op with a
// float32 argument beside a float64 self (ASGD's ax += mu * (p - ax), mu a float32 scalar) adds twice.
void writes_apart(const Plan& plan, torch::jit::Stack& wide, const torch::jit::Stack& stack, size_t base) {
  std::vector<int> at(plan.written.begin(), plan.written.end());
  if (plan.training >= 0 && stack[base + plan.training].toBool()) at.insert(at.end(), plan.hidden.begin(), plan.hidden.end());
  for (int i : at) {
    c10::IValue& w = wide[i];
    const c10::IValue& v = stack[base + i];
    if (w.isTensor() && v.isTensor()) {
      if (w.toTensor().is_same(v.toTensor())) w = c10::IValue(w.toTensor().clone());
    } else if (w.isTensorList() && v.isTensorList()) {
      const c10::List<at::Tensor> mine = v.toTensorList();
      const c10::List<at::Tensor> theirs = w.toTensorList();
      c10::List<at::Tensor> own;
      own.reserve(theirs.size());
      for (size_t j = 0; j < theirs.size(); ++j) {
        const at::Tensor t = theirs.get(j);
        own.push_back(j < mine.size() && t.is_same(mine.get(j)) ? t.clone() : t);
      }
      w = c10::IValue(own);
    }
  }
}

// widen.pairs: the op's results beside its twin's, one for one; a result whose twin is not float64
// (or that is none of float32, half, bfloat16 and float64) stands for itself, and Python's checks see it.
std::vector<std::pair<at::Tensor, at::Tensor>> twin_pairs(const Plan& plan, const std::vector<at::Tensor>& out,
                                                          const std::vector<at::Tensor>& wide) {
  bool same = out.size() == wide.size();
  for (size_t i = 0; same && i < out.size(); ++i) same = out[i].sizes() == wide[i].sizes();
  if (!same)
    throw std::runtime_error(plan.name + ": its float64 twin gave other results than the float32 op, so it cannot "
                             "be rounded: compute it in float64");
  std::vector<std::pair<at::Tensor, at::Tensor>> found;
  for (size_t i = 0; i < out.size(); ++i) {
    const at::ScalarType st = out[i].scalar_type();
    const at::ScalarType wt = wide[i].scalar_type();  // widen._twinned
    const bool real = st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16;
    const bool twin = (real && wt == at::kDouble) ||
                      ((st == at::kComplexFloat || st == at::kComplexDouble) && wt == at::kComplexDouble);
    found.emplace_back(out[i], twin ? wide[i] : out[i]);
  }
  return found;
}

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::DispatchKeySet below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey);
  c10::impl::ExcludeDispatchKeyGuard off(kKey);  // the op's own inner calls and our Python are not seen
  Session* here = session_here();
  if (here == nullptr) {  // the key reached a thread with no session and none is shared: pass through
    op.redispatchBoxed(below, stack);
    return;
  }
  Session& s = *here;
  const Held held(s);
  const Plan& plan = plan_of(op, s);
  const size_t nargs = op.schema().arguments().size();
  const size_t base = stack->size() - nargs;
  if (plan.full >= 0) (*stack)[base + plan.full] = c10::IValue(true);  // as the Python mode's call
  const int cls = conditional(plan, *stack, base);
  note(s, plan.id, cls);
  if (cls == kRefused) {  // Python raises, naming the op
    Direct& d = s.direct;
    py::gil_scoped_acquire gil;
    py::object records = take_records(d);
    d.in_python = true;
    py::reinterpret_borrow<py::object>(s.on_op)(plan.id, cls, std::vector<at::Tensor>{}, d.op_index, d.cursor, records);
    throw std::runtime_error(plan.name + " is refused here");  // not reached: the call raises
  }
  const auto written = [&plan](const torch::jit::Stack& st, size_t at) {  // read before the call pops them
    std::vector<at::Tensor> found;
    for (int i : plan.written) collect(st[at + i], found);
    if (plan.training >= 0 && st[at + plan.training].toBool())
      for (int i : plan.hidden) collect(st[at + i], found);
    return found;
  };
  // widen.mixed and RoundingMode._mixed: a call torch refuses for taking float32 tensors beside
  // float64 ones runs again as its float64 twin, whose results are the op's; `back` pairs each
  // float32 tensor it writes with its widened copy, which hands its values back at the end.
  const bool mixed = mixed_inputs(op.schema(), *stack, base);
  torch::jit::Stack saved;
  if (mixed) saved.assign(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  std::vector<std::pair<at::Tensor, at::Tensor>> back;
  std::vector<at::Tensor> found;
  const auto call = [&]() -> bool {  // true: it ran as the twin
    if (cls != kMove || mixed) found = written(*stack, base);
    try {
      op.redispatchBoxed(below, stack);
      return false;
    } catch (const c10::Error&) {
      if (!mixed) throw;
    }
    torch::jit::Stack wide = widen_stack(op.schema(), saved, 0, true);
    std::vector<at::Tensor> copies = written(wide, 0);
    for (size_t i = 0; i < found.size(); ++i)
      if (!found[i].is_same(copies[i])) back.emplace_back(found[i], copies[i]);
    found = std::move(copies);
    stack->resize(base);
    stack->insert(stack->end(), wide.begin(), wide.end());
    op.redispatchBoxed(below, stack);
    return true;
  };
  const size_t nret = op.schema().returns().size();
  const auto hand_back = [&back, stack, nret]() {  // widen.write_back, then widen.unaliased
    if (back.empty()) return;
    for (auto& [t, w] : back) t.copy_(w);
    for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
      if (!(*stack)[i].isTensor()) continue;
      const at::Tensor& r = (*stack)[i].toTensor();
      for (auto& [t, w] : back)
        if (r.is_same(w)) {
          (*stack)[i] = c10::IValue(t);
          break;
        }
    }
  };
  if (cls == kMove) {
    call();
    hand_back();
    return;
  }
  // An inexact op on float32 (or half, bfloat16: widen.IN_STEP) runs again on its float64 twin
  // (dispatch/widen.py), whose results are rounded as the op's and then written into its own.
  bool narrow = cls == kInexact && narrow_inputs(op.schema(), *stack, base, true);
  torch::jit::Stack wide;
  std::vector<at::Tensor> wide_found;
  if (narrow) {
    wide = widen_stack(op.schema(), *stack, base, true);
    writes_apart(plan, wide, *stack, base);
    wide_found = written(wide, 0);
  }
  // widen.default_twin: a float32 result from no float32 argument is in torch's default dtype; its
  // twin is the call again under a float64 default, after the op (which writes no argument).
  const bool may_default = cls == kInexact && !narrow && plan.written.empty() && plan.hidden.empty();
  if (may_default) wide.assign(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  if (call()) narrow = false;  // it ran as the twin: its results are float64 already
  std::vector<at::Tensor> results = touched(std::move(found), *stack, nret);
  std::vector<std::pair<at::Tensor, at::Tensor>> twins;
  const bool defaulted = may_default && std::any_of(results.begin(), results.end(), [](const at::Tensor& t) {
                           return t.scalar_type() == at::kFloat;
                         });
  if (narrow) {
    op.redispatchBoxed(below, &wide);
  } else if (defaulted) {
    const caffe2::TypeMeta before = c10::get_default_dtype();
    c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
    try {
      op.redispatchBoxed(below, &wide);
    } catch (...) {
      c10::set_default_dtype(before);
      throw;
    }
    c10::set_default_dtype(before);
  }
  if (narrow || defaulted) {
    twins = twin_pairs(plan, results, touched(std::move(wide_found), wide, nret));
    for (size_t i = 0; i < results.size(); ++i) results[i] = twins[i].second;
  }
  std::vector<at::Tensor> doubles;
  for (const at::Tensor& t : results) {
    const at::ScalarType st = t.scalar_type();
    const bool unrounded = st == at::kFloat || st == at::kHalf || st == at::kBFloat16 || st == at::kComplexFloat ||
                           st == at::kComplexHalf;
    // an inexact op's result in a precision a step never rounds goes to Python, which refuses it; a
    // complex128 one goes to Python too, which rounds its (real, imaginary) lanes (roles._round_results)
    if (st == at::kDouble || st == at::kComplexDouble || (unrounded && cls == kInexact)) doubles.push_back(t);
  }
  const auto write_back = [&twins, &hand_back]() {  // widen.write_back
    for (auto& [t, w] : twins)
      if (!t.is_same(w)) t.copy_(w);
    hand_back();
  };
  // In order: the first tensor a kernel does not take, and every one after it, go to Python (the
  // op index follows the tensors' order).
  size_t done = 0;
  while (done < doubles.size() && doubles[done].scalar_type() == at::kDouble &&
         doubles[done].layout() == at::kStrided && round_direct(s.direct, plan, cls, doubles[done]))
    ++done;
  if (done == doubles.size()) {
    write_back();
    return;
  }
  doubles.erase(doubles.begin(), doubles.begin() + done);
  Direct& d = s.direct;
  py::gil_scoped_acquire gil;
  py::object records = take_records(d);
  d.in_python = true;
  auto synced = py::reinterpret_borrow<py::object>(s.on_op)(plan.id, cls, doubles, d.op_index, d.cursor, records)
                    .cast<py::tuple>();  // raises error_already_set
  d.in_python = false;
  d.op_index = synced[0].cast<int64_t>();
  d.cursor = synced[1].cast<int64_t>();
  write_back();
}

// A sparse replay's entries, as SparseStepLog.columns gives them: a (k, 4) table of (op index, name
// id, count, entry count), the names, and every entry's positions one after another.
void set_sparse_entries(Direct& d, py::tuple columns) {
  const auto table = columns[0].cast<at::Tensor>();
  d.names = columns[1].cast<std::vector<std::string>>();
  d.positions = columns[2].cast<at::Tensor>();
  const auto cpu_longs = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kLong && t.is_contiguous();
  };
  if (!cpu_longs(table) || table.dim() != 2 || table.size(1) != 4 || !cpu_longs(d.positions) || d.positions.dim() != 1)
    throw std::runtime_error("sparse entries: a (k, 4) int64 table and flat int64 positions on the CPU");
  const int64_t* row = table.data_ptr<int64_t>();
  const auto names = static_cast<int64_t>(d.names.size());
  int64_t offset = 0;
  d.entries.reserve(table.size(0));
  for (int64_t i = 0; i < table.size(0); ++i, row += 4) {
    if (row[1] < 0 || row[1] >= names || row[3] < 0 || row[3] > d.positions.numel() - offset)
      throw std::runtime_error("sparse entries: a name id or an entry count out of range");
    d.entries.push_back({row[0], static_cast<int>(row[1]), row[2], offset, row[3], at::Tensor()});
    offset += row[3];
  }
}

// The kernels the session may call: (round_inplace, record, replay, trits record, trits replay,
// round_nearest) addresses, 0 for none; the grid and the packed log's threshold; the band callback and the bands
// known ahead; the entries to replay: a sparse log's as columns (set_sparse_entries), a packed log's as (op index, name, count, trits).
void set_direct(Direct& d, py::tuple kernels, int64_t k0, int64_t max_finite, int64_t threshold, bool count_free,
                py::object band_for, const at::Tensor& bands, py::object entries) {
  d = Direct();
  // The bands Python worked out in earlier sessions, by row: band_of asks band_for only past them
  // (each ask takes the GIL, which the transcript writer's thread may hold, in the middle of a step).
  if (!bands.device().is_cpu() || bands.scalar_type() != at::kLong || !bands.is_contiguous() || bands.dim() != 2 ||
      bands.size(1) != 2)
    throw std::runtime_error("bands: a (rows, 2) int64 tensor of (rel, abs) on the CPU");
  const int64_t* band = bands.data_ptr<int64_t>();
  d.bands.resize(bands.size(0));
  d.have_band.assign(bands.size(0), 1);
  for (int64_t row = 0; row < bands.size(0); ++row) d.bands[row] = {band[2 * row], band[2 * row + 1]};
  d.round_inplace = reinterpret_cast<InplaceFn>(kernels[0].cast<intptr_t>());
  d.record = reinterpret_cast<RecordFn>(kernels[1].cast<intptr_t>());
  d.replay = reinterpret_cast<ReplayFn>(kernels[2].cast<intptr_t>());
  d.trits_record = reinterpret_cast<TritsRecordFn>(kernels[3].cast<intptr_t>());
  d.trits_replay = reinterpret_cast<TritsReplayFn>(kernels[4].cast<intptr_t>());
  d.round_nearest = reinterpret_cast<InplaceFn>(kernels[5].cast<intptr_t>());
  const int logs = (d.record != nullptr) + (d.replay != nullptr) + (d.trits_record != nullptr) +
                   (d.trits_replay != nullptr) + (d.round_nearest != nullptr);
  if (logs > 1) throw std::runtime_error("one of record, replay, trits record, trits replay, round nearest at most");
  d.k0 = k0;
  d.max_finite = max_finite;
  d.threshold = threshold;
  d.count_free = count_free ? 1 : 0;
  if (py::isinstance<py::tuple>(entries)) {
    set_sparse_entries(d, entries.cast<py::tuple>());
  } else {
    if (d.replay != nullptr) throw std::runtime_error("sparse entries: a sparse replay takes them as columns");
    auto list = entries.cast<py::list>();
    d.entries.reserve(list.size());
    for (const py::handle& h : list) {
      auto e = h.cast<py::tuple>();
      d.names.push_back(e[1].cast<std::string>());
      d.entries.push_back({e[0].cast<int64_t>(), static_cast<int>(d.names.size() - 1), e[2].cast<int64_t>(), 0, 0,
                           e[3].cast<at::Tensor>()});
    }
  }
  d.band_for = band_for.release().ptr();  // last: nothing above holds a reference when it throws
}

void enter(py::object plan_for, py::object on_op, py::tuple kernels, int64_t k0, int64_t max_finite, int64_t threshold,
           bool count_free, py::object band_for, const at::Tensor& bands, py::object entries, bool shared) {
  Session& s = session;
  if (s.active) throw std::runtime_error("the dispatch front is already on in this thread");
  set_direct(s.direct, kernels, k0, max_finite, threshold, count_free, std::move(band_for), bands, entries);
  s.plan_for = plan_for.release().ptr();
  s.on_op = on_op.release().ptr();
  s.seen.clear();
  s.first_calls.clear();
  s.prior_included = c10::impl::tls_is_dispatch_key_included(kKey);
  s.shared = shared;
  if (shared) {
    std::lock_guard<std::mutex> guard(shared_lock);
    shared_sessions.push_back(&s);
  }
  s.active = true;
  c10::impl::tls_set_dispatch_key_included(kKey, true);
}

// Switch off; (first calls, op index, cursor, records, logged by row, rounded by row, corrections,
// free, tensors the kernels took). Op index and cursor are -1 when the last Python call raised:
// Python's own are the newer then.
py::tuple leave() {
  Session& s = session;
  if (!s.active) throw std::runtime_error("the dispatch front is not on in this thread");
  c10::impl::tls_set_dispatch_key_included(kKey, s.prior_included);
  if (s.shared) {
    std::lock_guard<std::mutex> guard(shared_lock);
    shared_sessions.erase(std::remove(shared_sessions.begin(), shared_sessions.end(), &s), shared_sessions.end());
    s.shared = false;
  }
  s.active = false;
  Py_CLEAR(s.plan_for);
  Py_CLEAR(s.on_op);
  Direct& d = s.direct;
  Py_CLEAR(d.band_for);
  std::vector<std::pair<int, int>> calls;
  calls.swap(s.first_calls);
  const int64_t op_index = d.in_python ? -1 : d.op_index;
  const int64_t cursor = d.in_python ? -1 : d.cursor;
  py::tuple out = py::make_tuple(calls, op_index, cursor, take_records(d), d.logged, d.rounded, d.corrections, d.free,
                                 d.tensors);
  d = Direct();
  return out;
}

bool active() { return session.active; }

// How many shared sessions are open, in every thread.
int64_t shared_open() {
  std::lock_guard<std::mutex> guard(shared_lock);
  return static_cast<int64_t>(shared_sessions.size());
}

// Set whether this thread's ops reach the front; the setting before. Code that runs with the
// dispatch modes suspended (the RNG's integer words) suspends the front as well.
bool set_included(bool on) {
  const bool before = c10::impl::tls_is_dispatch_key_included(kKey);
  c10::impl::tls_set_dispatch_key_included(kKey, on);
  return before;
}

// Each tensor's data pointer, dtype, device, contiguity and shape, as bytes: equal bytes, the same
// layouts. The state's buffer plan (state/canonical.py) checks its tensors with one call a step, where Python
// reads five attributes a tensor (some 60 us a gpt-shakespeare step).
py::bytes layouts(const std::vector<at::Tensor>& tensors) {
  std::string out;
  for (const at::Tensor& t : tensors) {
    const int64_t head[5] = {
        reinterpret_cast<int64_t>(t.data_ptr()),
        static_cast<int64_t>(t.scalar_type()),
        static_cast<int64_t>(t.device().type()) << 16 | static_cast<uint16_t>(t.device().index()),
        t.is_contiguous(),
        t.dim(),
    };
    out.append(reinterpret_cast<const char*>(head), sizeof head);
    out.append(reinterpret_cast<const char*>(t.sizes().data()), t.sizes().size() * sizeof(int64_t));
  }
  return py::bytes(out);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, Fake, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("enter", &enter, "Switch the front on for this thread, with the kernels it may call.");
  m.def("leave", &leave, "Switch it off; what the session did that Python has not seen.");
  m.def("active", &active, "Whether the front is on in this thread.");
  m.def("shared_open", &shared_open, "How many shared sessions are open, in every thread.");
  m.def("set_included", &set_included, "Set whether this thread's ops reach the front; the setting before.");
  m.def("layouts", &layouts, "Each tensor's data pointer, dtype, device, contiguity and shape, as bytes.");
}
