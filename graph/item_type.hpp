#pragma once

#include <string>
#include <typeindex>
#include <typeinfo>

namespace flowtrain {

/// Readable name of a C++ type, for error messages ("std::vector<unsigned long>").
std::string demangle(const std::type_info& type);

/// The input type of a sink that accepts items of any type (it cannot look at them).
struct Anything {};

/// The output type of a stage that emits the items it receives, whatever their type (`merge`).
struct SameAsInputs {};

/// The C++ type of the items a stage takes or emits. Adjacent stages must agree on it;
/// a stage whose input type is `Anything` accepts every type (a generic sink).
struct ItemType {
  std::type_index id = typeid(void);

  template <class T>
  static ItemType of() {
    return ItemType{typeid(T)};
  }
  bool is_none() const { return id == typeid(void); }
  bool accepts(const ItemType& produced) const {
    return id == produced.id || id == typeid(Anything);
  }
  std::string name() const {
    if (is_none()) return "nothing";
    if (id == typeid(Anything)) return "any type";
    if (id == typeid(SameAsInputs)) return "its inputs' type";
    return demangle_index(id);
  }

 private:
  static std::string demangle_index(std::type_index index);
};

}  // namespace flowtrain
