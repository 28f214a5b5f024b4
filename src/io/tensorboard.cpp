#include "io/tensorboard.h"

#include <unistd.h>

#include <boost/crc.hpp>
#include <chrono>

#include "core/error.h"
#include "io/tensorboard.pb.h"

namespace anvil {

namespace {
double now_s() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

uint32_t tfrecord_masked_crc(const void* data, size_t n) {
    boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;  // CRC-32C
    crc.process_bytes(data, n);
    const uint32_t c = crc.checksum();
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    path_ = fmt::format("{}/events.out.tfevents.{}.{}.anvil", dir, int64_t(now_s()), host);
    f_.open(path_, std::ios::binary | std::ios::app);
    ANVIL_CHECK(f_.good(), "{}: cannot create the TensorBoard event file", path_);
    tensorboard::Event e;
    e.set_wall_time(now_s());
    e.set_file_version("brain.Event:2");
    write_record(e.SerializeAsString());
    f_.flush();
}

void TensorBoardWriter::write_record(const std::string& data) {
    const uint64_t len = data.size();
    char header[12];
    for (int i = 0; i < 8; i++) header[i] = char((len >> (8 * i)) & 0xff);
    const uint32_t lc = tfrecord_masked_crc(header, 8);
    for (int i = 0; i < 4; i++) header[8 + i] = char((lc >> (8 * i)) & 0xff);
    const uint32_t dc = tfrecord_masked_crc(data.data(), data.size());
    char footer[4];
    for (int i = 0; i < 4; i++) footer[i] = char((dc >> (8 * i)) & 0xff);
    f_.write(header, 12);
    f_.write(data.data(), std::streamsize(data.size()));
    f_.write(footer, 4);
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
    tensorboard::Event e;
    e.set_wall_time(now_s());
    e.set_step(step);
    auto* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(float(value));
    write_record(e.SerializeAsString());
}

}  // namespace anvil
