#include "stages/util/discard.hpp"

namespace flowtrain::stages {

StageDoc DiscardSink::describe() { return {"Accepts items of any type and discards them.", {}}; }

void DiscardSink::consume(Anything&& /*item*/, ItemContext& /*ctx*/) {}

FLOWTRAIN_REGISTER_STAGE("discard", DiscardSink);

}  // namespace flowtrain::stages
