#include "common/common.h"
