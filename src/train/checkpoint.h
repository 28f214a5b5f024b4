// Training checkpoints from a run: the replicas' and tensor-parallel pieces gathered, the state composed, the
// directory written in the checkpoint format (runtime/checkpoint.h), old ones dropped.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "runtime/checkpoint.h"

namespace anvil {

struct RunSetup;
struct LossScaler;

// Writes a full training checkpoint of `run` at `step` to OUT/name atomically, then drops checkpoint-N
// directories beyond --keep-checkpoints. Every rank of a job calls it: the replicas check that their weights
// agree, tensor-parallel groups gather their pieces, then rank 0 writes (trainer_state.json records the world
// size; the options, --tensor-parallel).
void save_checkpoint(const RunSetup& run, int64_t step, const std::string& name);
// The loss scaler's state as trainer_state.json keeps it, and back.
nlohmann::json scaler_to_json(const LossScaler& s);
void scaler_from_json(const nlohmann::json& state, LossScaler& s);

}  // namespace anvil
