#pragma once

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "graph/stage.hpp"

namespace flowtrain {

namespace detail {
template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

// The call signature of a lambda or function object with one operator() (const or not).
template <class F>
struct CallOf : CallOf<decltype(&F::operator())> {};
template <class C, class R, class... A>
struct CallOf<R (C::*)(A...) const> {
  using result = R;
  using args = std::tuple<std::decay_t<A>...>;
  static constexpr std::size_t arity = sizeof...(A);
};
template <class C, class R, class... A>
struct CallOf<R (C::*)(A...)> : CallOf<R (C::*)(A...) const> {};

template <class F>
concept HasOneCall = requires { &F::operator(); };
}  // namespace detail

/// A source made of a function returning std::optional<Out> (std::nullopt: exhausted).
template <class Out, class F>
class LambdaSource final : public Source<Out> {
 public:
  explicit LambdaSource(F fn) : fn_(std::move(fn)) {}

 protected:
  std::optional<Out> next() override { return fn_(); }

 private:
  F fn_;
};

/// A map made of a function from In to Out, or to std::optional<Out> (std::nullopt drops the
/// item, reported as "dropped by a lambda").
template <class In, class Out, class F>
class LambdaMap final : public Map<In, Out> {
 public:
  explicit LambdaMap(F fn) : fn_(std::move(fn)) {}

 protected:
  std::optional<Out> process(In&& in, ItemContext& ctx) override {
    if constexpr (detail::IsOptional<std::invoke_result_t<F&, In&&>>::value) {
      std::optional<Out> out = fn_(std::move(in));
      return out ? std::move(out) : ctx.drop("dropped by a lambda");
    } else {
      return fn_(std::move(in));
    }
  }

 private:
  F fn_;
};

/// A sink made of a function taking In and returning nothing.
template <class In, class F>
class LambdaSink final : public Sink<In> {
 public:
  explicit LambdaSink(F fn) : fn_(std::move(fn)) {}

 protected:
  void consume(In&& in, ItemContext&) override { fn_(std::move(in)); }

 private:
  F fn_;
};

namespace detail {
// The stage a lambda makes: () -> optional<T> a source; (In) -> void a sink; (In) -> Out or
// optional<Out> a map. Anything else is not a lambda stage.
template <class F>
auto lambda_stage_type() {
  using Call = CallOf<F>;
  using R = typename Call::result;
  if constexpr (Call::arity == 0 && IsOptional<R>::value) {
    return std::type_identity<LambdaSource<typename R::value_type, F>>{};
  } else if constexpr (Call::arity == 1) {
    using In = std::tuple_element_t<0, typename Call::args>;
    if constexpr (std::is_void_v<R>) {
      return std::type_identity<LambdaSink<In, F>>{};
    } else if constexpr (IsOptional<R>::value) {
      return std::type_identity<LambdaMap<In, typename R::value_type, F>>{};
    } else {
      return std::type_identity<LambdaMap<In, R, F>>{};
    }
  } else {
    return std::type_identity<void>{};
  }
}

template <class F>
concept LambdaStage =
    HasOneCall<F> && !std::is_void_v<typename decltype(lambda_stage_type<F>())::type>;

template <LambdaStage F>
using LambdaStageOf = typename decltype(lambda_stage_type<F>())::type;
}  // namespace detail

}  // namespace flowtrain
