// TensorBoard event files: `tensorboard --logdir RUN_DIR` shows the run's scalars. Records are framed as
// TFRecords (length, masked CRC-32C of the length, the serialized Event, masked CRC-32C of it).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace anvil {

class TensorBoardWriter {
public:
    // Creates DIR/events.out.tfevents.<unix time>.<host>.anvil and writes the file-version event.
    explicit TensorBoardWriter(const std::string& dir);
    void scalar(const std::string& tag, double value, int64_t step);
    void flush() { f_.flush(); }
    const std::string& path() const { return path_; }

private:
    void write_record(const std::string& data);
    std::string path_;
    std::ofstream f_;
};

// TFRecord's CRC: CRC-32C (Castagnoli), rotated and offset.
uint32_t tfrecord_masked_crc(const void* data, size_t n);

}  // namespace anvil
