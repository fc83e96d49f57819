#include "gguf/tensor_type.h"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace tern {
namespace {

struct Entry {
    uint32_t id;
    TensorTypeInfo info;
};

// Block sizes follow the GGUF specification; "supported" marks what src/quant implements.
constexpr Entry kTypes[] = {
    {0, {"f32", 1, 4, true}},         {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 18, true}},      {3, {"q4_1", 32, 20, true}},
    {6, {"q5_0", 32, 22, true}},      {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},      {9, {"q8_1", 32, 36, true}},
    {10, {"q2_K", 256, 84, true}},    {11, {"q3_K", 256, 110, true}},
    {12, {"q4_K", 256, 144, true}},   {13, {"q5_K", 256, 176, true}},
    {14, {"q6_K", 256, 210, true}},   {15, {"q8_K", 256, 292, true}},
    {16, {"iq2_xxs", 256, 66, false}}, {17, {"iq2_xs", 256, 74, false}},
    {18, {"iq3_xxs", 256, 98, false}}, {19, {"iq1_s", 256, 50, false}},
    {20, {"iq4_nl", 32, 18, false}},  {21, {"iq3_s", 256, 110, false}},
    {22, {"iq2_s", 256, 82, false}},  {23, {"iq4_xs", 256, 136, false}},
    {24, {"i8", 1, 1, false}},        {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},       {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},       {29, {"iq1_m", 256, 56, false}},
    {30, {"bf16", 1, 2, true}},       {34, {"tq1_0", 256, 54, false}},
    {35, {"tq2_0", 256, 66, false}},  {39, {"mxfp4", 32, 17, false}},
};

const Entry* find(uint32_t id) {
    for (const Entry& e : kTypes)
        if (e.id == id) return &e;
    return nullptr;
}

}  // namespace

std::optional<TensorTypeInfo> tensor_type_info(uint32_t type_id) {
    const Entry* e = find(type_id);
    if (!e) return std::nullopt;
    return e->info;
}

std::string tensor_type_name(uint32_t type_id) {
    const Entry* e = find(type_id);
    return e ? std::string(e->info.name) : "type#" + std::to_string(type_id);
}

std::optional<TensorType> tensor_type_from_name(const std::string& name) {
    std::string want;
    std::transform(name.begin(), name.end(), std::back_inserter(want),
                   [](unsigned char c) { return char(std::tolower(c)); });
    for (const Entry& e : kTypes) {
        std::string have = e.info.name;
        std::transform(have.begin(), have.end(), have.begin(),
                       [](unsigned char c) { return char(std::tolower(c)); });
        if (have == want) return TensorType(e.id);
    }
    return std::nullopt;
}

bool tensor_type_supported(uint32_t type_id) {
    const Entry* e = find(type_id);
    return e && e->info.supported;
}

}  // namespace tern
