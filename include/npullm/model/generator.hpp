// The former name of model/synthetic.hpp (it collided with batch::generator, which generates
// tokens). Include npullm/model/synthetic.hpp.
#pragma once

#include "npullm/model/synthetic.hpp"
