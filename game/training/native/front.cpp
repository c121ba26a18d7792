// The dispatch front: a C++ boxed fallback, below autograd, that stands in for RoundingMode's
// Python __torch_dispatch__ on CPU (front.py says when).
//
// Why: a TorchDispatchMode costs some 9 us of Python for every ATen op a step runs, and half the
// ops of a step round nothing (views, copies, indexing). Here those ops run with no Python at all,
// and an op that rounds calls Python once, with only the float64 tensors it produced or changed.
// What counts as produced or changed, and each op's class, is what intercept.py says: the classes
// come from its Python code (once per op), and touched() below mirrors its _touched() line by line.
//
// The fallback sits on DispatchKey::Fake, a key reserved for out-of-tree code below autograd
// (every key the Python API exposes there already holds a fallback). It is switched on for one
// thread by including the key in that thread's local dispatch key set; autograd's engine carries
// that set to the backward pass.

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <mutex>
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
};

struct Plan {
  int id = 0;                 // the op's row in front.py's table
  int kind = kInexact;
  int arg = -1;               // position of alpha / rounding_mode / accumulate, -1 when absent
  std::vector<int> written;   // positions the schema marks Tensor(a!)
  std::vector<int> hidden;    // positions written without a mark (batch norm's running stats)
  int training = -1;          // position of the flag that turns the hidden writes on
};

std::mutex plans_lock;
std::unordered_map<const c10::FunctionSchema*, Plan> plans;

// One thread's session, between enter() and leave().
struct Session {
  bool active = false;
  PyObject* plan_for = nullptr;  // (schema name, overload) -> (id, kind, arg, written, hidden, training)
  PyObject* on_op = nullptr;     // (id, class, [tensors]) -> None
  std::vector<char> seen;        // by plan id: whether first_calls has the op
  std::vector<std::pair<int, int>> first_calls;  // (plan id, class of its first call), in call order
  bool prior_included = false;
};

thread_local Session session;

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

int conditional(const Plan& plan, const torch::jit::Stack& stack, size_t base) {  // _conditional_class
  switch (plan.kind) {
    case kAlpha:
      return plan.arg < 0 || equals_one(stack[base + plan.arg]) ? kExact : kInexact;
    case kDiv:
      if (plan.arg >= 0 && !stack[base + plan.arg].isNone()) return kInexact;
      return big_tensors(stack[base + 1]) ? kExact : kInexact;
    case kAccumulate:
      return stack[base + plan.arg].toBool() ? kInexact : kMove;
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

// intercept._touched: arguments the op wrote, then its outputs that are not among them.
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

void note(Session& s, int id, int cls) {
  if (static_cast<size_t>(id) >= s.seen.size()) s.seen.resize(id + 1, 0);
  if (!s.seen[id]) {
    s.seen[id] = 1;
    s.first_calls.emplace_back(id, cls);
  }
}

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::DispatchKeySet below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey);
  c10::impl::ExcludeDispatchKeyGuard off(kKey);  // the op's own inner calls and our Python are not seen
  Session& s = session;
  if (!s.active) {  // the key reached a thread with no session: pass through
    op.redispatchBoxed(below, stack);
    return;
  }
  const Plan& plan = plan_of(op, s);
  const size_t nargs = op.schema().arguments().size();
  const size_t base = stack->size() - nargs;
  const int cls = conditional(plan, *stack, base);
  note(s, plan.id, cls);
  if (cls == kMove) {
    op.redispatchBoxed(below, stack);
    return;
  }
  std::vector<at::Tensor> found;  // the written arguments, read before the call pops them
  for (int i : plan.written) collect((*stack)[base + i], found);
  if (plan.training >= 0 && (*stack)[base + plan.training].toBool())
    for (int i : plan.hidden) collect((*stack)[base + i], found);
  op.redispatchBoxed(below, stack);
  std::vector<at::Tensor> doubles;
  for (const at::Tensor& t : touched(std::move(found), *stack, op.schema().returns().size()))
    if (t.scalar_type() == at::kDouble) doubles.push_back(t);
  if (doubles.empty()) return;
  py::gil_scoped_acquire gil;
  py::reinterpret_borrow<py::object>(s.on_op)(plan.id, cls, doubles);  // raises error_already_set
}

void enter(py::object plan_for, py::object on_op) {
  Session& s = session;
  if (s.active) throw std::runtime_error("the dispatch front is already on in this thread");
  s.plan_for = plan_for.release().ptr();
  s.on_op = on_op.release().ptr();
  s.seen.clear();
  s.first_calls.clear();
  s.prior_included = c10::impl::tls_is_dispatch_key_included(kKey);
  s.active = true;
  c10::impl::tls_set_dispatch_key_included(kKey, true);
}

std::vector<std::pair<int, int>> leave() {
  Session& s = session;
  if (!s.active) throw std::runtime_error("the dispatch front is not on in this thread");
  c10::impl::tls_set_dispatch_key_included(kKey, s.prior_included);
  s.active = false;
  Py_CLEAR(s.plan_for);
  Py_CLEAR(s.on_op);
  std::vector<std::pair<int, int>> calls;
  calls.swap(s.first_calls);
  return calls;
}

bool active() { return session.active; }

// Set whether this thread's ops reach the front; the setting before. Code that runs with the
// dispatch modes suspended (the RNG's integer words) suspends the front as well.
bool set_included(bool on) {
  const bool before = c10::impl::tls_is_dispatch_key_included(kKey);
  c10::impl::tls_set_dispatch_key_included(kKey, on);
  return before;
}

}  // namespace

TORCH_LIBRARY_IMPL(_, Fake, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("enter", &enter, "Switch the front on for this thread.");
  m.def("leave", &leave, "Switch it off; the (plan id, class) of each op's first call, in call order.");
  m.def("active", &active, "Whether the front is on in this thread.");
  m.def("set_included", &set_included, "Set whether this thread's ops reach the front; the setting before.");
}
