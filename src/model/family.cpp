#include "model/family.h"

namespace tern::model {
namespace {
const Family* const kFamilies[] = {&kLlama, &kQwen2, &kQwen3, &kQwen3Moe, &kGemma3, &kPhi3};
}  // namespace

const Family* find_family(std::string_view arch) {
    for (const Family* f : kFamilies)
        if (f->arch == arch) return f;
    return nullptr;
}

std::string family_names() {
    std::string names;
    for (const Family* f : kFamilies) {
        if (!names.empty()) names += ", ";
        names += f->arch;
    }
    return names;
}

}  // namespace tern::model
