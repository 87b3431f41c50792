#pragma once
/// Parameter structs and their enums as Python types: `P(**fields)`, attribute access, enum
/// fields that also take the vendor's integer, and a repr that lists every field.

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace attnref::python {

namespace py = pybind11;

/// Binds enum E as `scope.<name>` with the given (name, value) pairs; `str(E.X)` is "X".
template <class E>
py::enum_<E> bind_enum(py::handle scope, const char* name,
                       std::initializer_list<std::pair<const char*, E>> values) {
  py::enum_<E> e(scope, name);
  for (const auto& [n, v] : values) e.value(n, v);
  return e;
}

/// The enum value of a vendor integer: ValueError when it does not fit E's underlying type (the
/// range of the values themselves is the operator's check).
template <class E>
E enum_from_int(const char* field, const py::object& v) {
  using U = std::underlying_type_t<E>;
  long long x = 0;
  try {
    x = v.cast<long long>();
  } catch (const py::cast_error&) {
    x = std::numeric_limits<long long>::max();
  }
  if (x < static_cast<long long>(std::numeric_limits<U>::min()) ||
      x > static_cast<long long>(std::numeric_limits<U>::max()))
    throw py::value_error(std::string("attnref: ") + field + " = " + std::string(py::str(v)) +
                          " is outside the enum's range");
  return static_cast<E>(static_cast<U>(x));
}

/// Binds the parameter struct P field by field.
template <class P>
class ParamsBinder {
 public:
  ParamsBinder(py::module_& m, const char* name, const char* doc)
      : cls_(m, name, doc), names_(std::make_shared<std::vector<std::string>>()) {}

  py::class_<P>& cls() { return cls_; }

  /// A field: plain ones read and write as Python values; an enum field returns its enum and
  /// takes the enum or the vendor's integer value (range checked when the operator runs).
  template <class F>
  ParamsBinder& field(const char* name, F P::*member) {
    names_->push_back(name);
    if constexpr (std::is_enum_v<F>) {
      cls_.def_property(
          name, [member](const P& p) { return p.*member; },
          [member, name](P& p, const py::object& v) {
            if (py::isinstance<F>(v))
              p.*member = v.cast<F>();
            else if (py::isinstance<py::int_>(v))
              p.*member = enum_from_int<F>(name, v);
            else
              throw py::type_error("attnref: an enum field takes its enum or an int, got " +
                                   std::string(py::str(v.get_type().attr("__name__"))));
          });
    } else {
      cls_.def_readwrite(name, member);
    }
    return *this;
  }

  /// Adds __init__(**fields), __repr__ and __eq__; call after the last field.
  void finish() {
    auto names = names_;
    const std::string type_name = py::str(cls_.attr("__name__"));
    cls_.def(py::init([names, type_name](const py::kwargs& kw) {
      P p{};
      py::object self = py::cast(&p, py::return_value_policy::reference);
      for (auto item : kw) {
        const std::string k = py::str(item.first);
        bool known = false;
        for (const auto& n : *names) known = known || n == k;
        if (!known) throw py::type_error(type_name + ": no field named '" + k + "'");
        py::setattr(self, item.first, item.second);
      }
      return p;
    }));
    cls_.def("__repr__", [names, type_name](const py::object& self) {
      std::string s = type_name + "(";
      for (size_t i = 0; i < names->size(); ++i) {
        py::object v = self.attr((*names)[i].c_str());
        s += (i ? ", " : "") + (*names)[i] + "=" +
             std::string(py::str(py::hasattr(v, "name") && !py::isinstance<py::str>(v)
                                     ? py::str(v.get_type().attr("__name__")) + py::str(".") +
                                           py::str(v.attr("name"))
                                     : py::repr(v)));
      }
      return s + ")";
    });
    cls_.def("__eq__", [names](const py::object& a, const py::object& b) {
      if (!a.get_type().is(b.get_type())) return false;
      for (const auto& n : *names)
        if (!a.attr(n.c_str()).equal(b.attr(n.c_str()))) return false;
      return true;
    });
    cls_.def("__copy__", [](const P& p) { return P(p); });
    cls_.def("__deepcopy__", [](const P& p, const py::dict&) { return P(p); });
    cls_.def_property_readonly_static("fields", [names](const py::object&) {
      py::list l;
      for (const auto& n : *names) l.append(n);
      return py::tuple(l);
    });
  }

 private:
  py::class_<P> cls_;
  std::shared_ptr<std::vector<std::string>> names_;
};

}  // namespace attnref::python
